"""The rows of keys and values that recipes written for older TRL / transformers use.

Verified against the pinned versions (TRL 1.16.0, transformers 5.17.0): every `to` is a key the
recipe parser accepts, every removed key is absent from its dataclass (tests/test_migrate.py).
"""

from __future__ import annotations

from typing import Any

from maxent_grpo.migrate.kinds import Rows, ValueChange

TRANSFORMERS = Rows("transformers 5")
TRL = Rows("TRL 1.16")


def _warmup_fraction(value: Any) -> float:
    """warmup_ratio -> warmup_steps: transformers reads a float in [0, 1) as a fraction."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    ratio = float(value)
    if not 0 <= ratio < 1:
        raise ValueError(f"a warmup_ratio of {value} is not a fraction below 1")
    return ratio


ROWS = (
    # --- transformers 5 -----------------------------------------------------------------------
    TRANSFORMERS.rename("torch_dtype", to="dtype", why="renamed to dtype (TRL's ModelConfig)"),
    TRANSFORMERS.remove(
        "overwrite_output_dir",
        why="removed; a run here always resumes from the last complete checkpoint in output_dir "
        "(to start over, use a new output_dir)",
    ),
    TRANSFORMERS.convert(
        "warmup_ratio",
        to="warmup_steps",
        by=_warmup_fraction,
        why="removed; warmup_steps takes the same fraction (a float below 1 is a fraction of the "
        "total steps)",
    ),
    TRANSFORMERS.rename("evaluation_strategy", to="eval_strategy", why="renamed to eval_strategy"),
    TRANSFORMERS.rename("no_cuda", to="use_cpu", why="renamed to use_cpu"),
    TRANSFORMERS.remove(
        "logging_dir",
        why="removed; TensorBoard reads TENSORBOARD_LOGGING_DIR: set it in the recipe's env: block",
    ),
    TRANSFORMERS.remove("save_safetensors", why="removed; checkpoints are always safetensors"),
    # --- TRL 1.16 -----------------------------------------------------------------------------
    TRL.remove(
        "max_prompt_length",
        why="removed from GRPOConfig; TRL no longer truncates prompts: drop rows with overlong "
        "prompts from the dataset, and with vLLM set vllm_max_model_length to at least the "
        "longest prompt plus max_completion_length",
    ),
    TRL.remove(
        "vllm_device",
        why="removed; the launcher puts the vLLM server on GPUs of its own (vllm_mode: server) or "
        "TRL runs vLLM inside every training process (vllm_mode: colocate)",
    ),
    TRL.rename(
        "vllm_max_model_len", to="vllm_max_model_length", why="renamed to vllm_max_model_length"
    ),
    TRL.rename(
        "vllm_guided_decoding_regex",
        to="vllm_structured_outputs_regex",
        why="renamed to vllm_structured_outputs_regex",
    ),
    TRL.remove("vllm_enable_prefix_caching", why="removed; vLLM caches prefixes by default"),
    TRL.remove(
        "use_liger_loss",
        why="removed; TRL 1.16 has no Liger GRPO loss (use_liger_kernel only patches the model's "
        "kernels, and is deprecated)",
    ),
    Rows("accelerate").remove(
        "zero3_save_16bit_model",
        why="a DeepSpeed ZeRO-3 option of the accelerate config file, not of the recipe "
        "(deepspeed_config: zero3_save_16bit_model: true gathers 16-bit weights when saving); "
        "recipes/accelerate_configs/zero3.yaml sets it: name that file in accelerate_config",
    ),
    TRL.rename(
        "wandb_log_unique_prompts", to="log_unique_prompts", why="renamed to log_unique_prompts"
    ),
)


def _top_k_off(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value < 0)


VALUE_CHANGES = (
    ValueChange(
        "top_k",
        "-1 or null (top-k off in TRL before v0.27 and in vLLM)",
        "0",
        "TRL v0.27 made 0 the value that turns top-k off (-1 is refused)",
        _top_k_off,
        lambda value: 0,
    ),
)
