"""The rows of keys that recipes written for open-r1 or older TRL / transformers use.

Verified against the pinned versions (TRL 1.16.0, transformers 5.17.0): every `to` is a key the
recipe parser accepts, every removed key is absent from its dataclass (tests/test_migrate.py).
Also: open-r1's keys that mean the same here, its defaults that differ, and its values that
have no counterpart.
"""

from __future__ import annotations

from typing import Any

from maxent_grpo.recipe.migration.kinds import REMOVE, DefaultChange, Rows, ValueChange

TRANSFORMERS = Rows("transformers 5")
TRL = Rows("TRL 1.16")
OPEN_R1 = Rows("open-r1")


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
    # --- open-r1's own keys -------------------------------------------------------------------
    OPEN_R1.alias(
        "dataset_solution_column",
        to="dataset_answer_column",
        why="open-r1's name of dataset_answer_column, read as dataset_answer_column",
    ),
    OPEN_R1.rename(
        "hub_model_revision",
        to="hub_revision",
        why="open-r1's branch to push to is transformers' hub_revision",
    ),
    OPEN_R1.remove(
        "push_to_hub_revision",
        why="switched open-r1's push callback; the Trainer pushes itself with push_to_hub: true, "
        "hub_strategy and hub_revision",
    ),
    OPEN_R1.remove(
        "overwrite_hub_revision",
        why="an option of open-r1's push callback; the Trainer commits on top of hub_revision",
    ),
    OPEN_R1.remove(
        "callbacks",
        why="named open-r1's callbacks (push_to_hub_revision); the Trainer pushes itself with "
        "push_to_hub: true, hub_strategy and hub_revision",
    ),
    OPEN_R1.rename(
        "max_completion_len",
        to="overlong_max_length",
        why="open-r1's length of soft_overlong_punishment is overlong_max_length",
    ),
    OPEN_R1.rename(
        "soft_punish_cache",
        to="overlong_buffer",
        why="open-r1's band of soft_overlong_punishment is overlong_buffer",
    ),
    OPEN_R1.remove(
        "e2b_router_url",
        why="code rewards run in the local sandbox here (code_provider: local), not on E2B",
    ),
    OPEN_R1.remove(
        "morph_router_url",
        why="code rewards run in the local sandbox here (code_provider: local), not on MorphCloud",
    ),
    OPEN_R1.remove(
        "ioi_provider",
        why="chose the IOI judge of ioi_code, which needs a network and is not available here",
    ),
    OPEN_R1.remove(
        "code_eval_scoring_mode",
        why="how open-r1's judged rewards (ioi_code, cf_code) score, and they are not "
        "available here",
    ),
    OPEN_R1.remove(
        "code_eval_test_batch_size",
        why="the local sandbox runs every test case of a row, parallel_code_exec_per_proc at a "
        "time",
    ),
)

#: Keys of open-r1's GRPO recipes that mean the same here (the parser accepts them as they
#: are; tests/test_migrate.py checks it). The docs list them next to the table.
UNCHANGED_KEYS = (
    "model_name_or_path",
    "model_revision",
    "attn_implementation",
    "dataset_name",
    "dataset_config",
    "dataset_mixture",
    "dataset_train_split",
    "dataset_test_split",
    "dataset_prompt_column",
    "system_prompt",
    "chat_template",
    "reward_funcs",
    "reward_weights",
    "cosine_min_value_wrong",
    "cosine_max_value_wrong",
    "cosine_min_value_correct",
    "cosine_max_value_correct",
    "cosine_max_len",
    "repetition_n_grams",
    "repetition_max_penalty",
    "code_provider",
    "code_language",
    "parallel_code_exec_per_proc",
    "bf16",
    "use_vllm",
    "vllm_mode",
    "vllm_server_timeout",
    "vllm_tensor_parallel_size",
    "beta",
    "loss_type",
    "scale_rewards",
    "epsilon",
    "epsilon_high",
    "mask_truncated_completions",
    "num_iterations",
    "num_generations",
    "temperature",
    "max_completion_length",
    "do_eval",
    "eval_strategy",
    "eval_steps",
    "per_device_eval_batch_size",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "gradient_checkpointing",
    "gradient_checkpointing_kwargs",
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "max_grad_norm",
    "max_steps",
    "num_train_epochs",
    "seed",
    "output_dir",
    "save_strategy",
    "save_steps",
    "save_total_limit",
    "log_completions",
    "num_completions_to_print",
    "log_level",
    "logging_first_step",
    "logging_steps",
    "logging_strategy",
    "report_to",
    "wandb_entity",
    "wandb_project",
    "wandb_run_group",
    "push_to_hub",
    "hub_model_id",
    "hub_strategy",
)

DEFAULT_CHANGES = (
    DefaultChange(
        "vllm_mode",
        "server",
        "use_vllm: true",
        "open-r1 ran vLLM on a GPU of its own; TRL 1.0 made colocate the default, where every "
        "GPU trains and also runs vLLM",
        lambda recipe: recipe.get("use_vllm") is True,
    ),
    DefaultChange(
        "dataset_prompt_column",
        "prompt",
        "a dataset is named (not builtin:)",
        "open-r1's default prompt column is prompt; here it is problem",
        lambda recipe: (
            bool(recipe.get("dataset_mixture"))
            or bool(recipe.get("dataset_name"))
            and not str(recipe["dataset_name"]).startswith("builtin:")
        ),
    ),
)


def _evaluates_without_test_split(recipe: dict[str, Any]) -> bool:
    strategy = recipe.get("eval_strategy", recipe.get("evaluation_strategy", "no"))
    name = recipe.get("dataset_name")
    return (
        strategy not in (None, "no")
        and "dataset_test_split" not in recipe
        and not recipe.get("dataset_mixture")
        and isinstance(name, str)
        and not name.startswith("builtin:")
    )


DEFAULT_CHANGES += (
    DefaultChange(
        "dataset_test_split",
        "test",
        "eval_strategy is not no and a hub dataset is named",
        "open-r1 (TRL's ScriptArguments) evaluated the test split by default; here there is "
        "no test split unless one is named",
        _evaluates_without_test_split,
    ),
)

#: The built-in benchmark names a recipe's `benchmarks` may list (evaluate/benchmarks.py
#: BUILTIN_BENCHMARKS defines them; tests/test_key_declarations.py checks they agree).
BUILTIN_BENCHMARK_NAMES = ("arithmetic", "word_problems")


def _lighteval_tasks_left_out(benchmarks: Any) -> Any:
    """open-r1's benchmarks are LightEval task names; keep the entries this toolkit knows."""
    kept = [b for b in benchmarks if not isinstance(b, str) or b in BUILTIN_BENCHMARK_NAMES]
    return kept or REMOVE


def _has_unknown_benchmark(benchmarks: Any) -> bool:
    entries = benchmarks if isinstance(benchmarks, list) else []
    return any(isinstance(b, str) and b not in BUILTIN_BENCHMARK_NAMES for b in entries)


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
    ValueChange(
        "code_provider",
        "e2b, morph",
        "local",
        "the tests run in the local sandbox instead of on a remote provider",
        lambda value: value in ("e2b", "morph"),
        lambda value: "local",
    ),
    ValueChange(
        "code_language",
        "anything but python",
        "left out",
        "the local sandbox runs Python programs only",
        lambda value: value != "python",
        lambda value: REMOVE,
    ),
    ValueChange(
        "benchmarks",
        "open-r1's LightEval task names (aime24, math_500, gpqa, ...)",
        "left out (the built-in names and mappings stay)",
        "open-r1 queued LightEval jobs for them; here a benchmark is a built-in name or a "
        "mapping {name, dataset, ...} (docs/evaluation.md)",
        _has_unknown_benchmark,
        _lighteval_tasks_left_out,
    ),
)
