"""The training section of a recipe (`recipe.training`): TRL's GRPOConfig plus our keys.

A recipe is a YAML file whose keys are the fields of its sections:

- ScriptArguments (recipe/script_keys.py): what to train on and how to score it.
- GRPOConfig (here): TRL's GRPOConfig plus our keys; MaxEntConfig (recipe/maxent_keys.py) for
  MaxEnt-GRPO.
- ModelConfig: TRL's model keys (`recipe.model`).
- LauncherKeys (recipe/launch_keys.py): keys only the launcher reads.

Each field is its key's one declaration: name, type, default, help, `choices` metadata (the
parser enforces them on every path) and, in an `Annotated` type, its range and the optional
package it needs (recipe/declare.py; ranges are checked when a recipe is read). The batch
arithmetic is checked in `recipe.checks`. `recipe.parser` reads a recipe; nothing here knows
about files or processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Annotated

import trl
from trl import ModelConfig

from maxent_grpo.errors import ConfigError, ConfigProblems
from maxent_grpo.methods import uses_vllm_server
from maxent_grpo.recipe.converters import CONVERTERS
from maxent_grpo.recipe.declare import Accepts, check_own_ranges
from maxent_grpo.recipe.launch_keys import LauncherKeys
from maxent_grpo.recipe.problems import run_checks
from maxent_grpo.recipe.script_keys import ScriptArguments
from maxent_grpo.rollout_filters import filters_help, find_filter

__all__ = [
    "ConfigError",
    "GRPOConfig",
    "LauncherKeys",
    "ModelConfig",
    "ScriptArguments",
]


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
    async_generation: bool = field(
        default=False,
        metadata={
            "help": "Server mode: generate the next step's completions on the vLLM server while "
            "the trainers train on this step's (one step ahead; docs: Asynchronous "
            "generation). Samples are then one policy version old (up to "
            "vllm_sync_interval_steps), which TRL's importance-sampling correction reweights. "
            "false: generate, then train (TRL's loop)."
        },
    )
    # TRL's name and meaning (trl/experimental/async_grpo), our default: one step ahead.
    max_staleness: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=1,
        metadata={
            "help": "With async_generation: the most optimizer steps a sample's policy may be "
            "behind the policy that trains on it; older samples are dropped (counted in "
            "async/dropped_stale) and generated again. At least vllm_sync_interval_steps."
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
    # Upstream MaxEnt-GRPO's entropy bonus on TRL's entropy_coef (train/entropy_kl.py).
    entropy_normalize_by_max: bool = field(
        default=False,
        metadata={
            "help": "Divide TRL's entropy bonus by ln(vocabulary size), the largest entropy, so "
            "entropy_coef weighs entropy as a fraction of its maximum (upstream MaxEnt-GRPO's "
            "scale). false: entropy in nats, as TRL."
        },
    )
    entropy_kl_threshold: Annotated[float | None, Accepts(range=(">", 0))] = field(
        default=None,
        metadata={
            "help": "KL(policy || reference) per token around which entropy_coef adapts, "
            "measured on each micro-batch before its loss (upstream MaxEnt-GRPO's "
            "maxent_alpha_kl_threshold; entropy_kl_below / entropy_kl_above say how). Needs "
            "entropy_coef > 0 and beta > 0. Unset: entropy_coef stays fixed."
        },
    )
    entropy_kl_below: str = field(
        default="keep",
        metadata={
            "help": "KL below entropy_kl_threshold: 'raise' multiplies entropy_coef by 1 + "
            "entropy_kl_gain * (threshold - KL) / threshold; 'keep' leaves it.",
            "choices": ["keep", "raise"],
        },
    )
    entropy_kl_above: str = field(
        default="keep",
        metadata={
            "help": "KL above entropy_kl_threshold: 'lower' multiplies entropy_coef by 1 / (1 + "
            "entropy_kl_gain * (KL - threshold) / threshold); 'off' sets it to 0 (outside the "
            "trust zone); 'keep' leaves it.",
            "choices": ["keep", "lower", "off"],
        },
    )
    entropy_kl_gain: Annotated[float, Accepts(range=(">=", 0))] = field(
        default=1.0, metadata={"help": "Gain of entropy_kl_below / entropy_kl_above."}
    )
    entropy_kl_min_multiplier: Annotated[float, Accepts(range=(">", 0, "<=", 1))] = field(
        default=0.5, metadata={"help": "Least multiplier of entropy_coef ('off' aside)."}
    )
    entropy_kl_max_multiplier: Annotated[float, Accepts(range=(">=", 1))] = field(
        default=2.0, metadata={"help": "Largest multiplier of entropy_coef."}
    )

    rollout_filters: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Group filters applied after scoring (docs/rollouts.md): a step trains only "
            f"on groups that pass all of them. Built in: {filters_help()}, or "
            "'module:function(prompts, completions, rewards) -> bool'."
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
        # Each value in its own range first (only for a section built directly: build_recipe's
        # keys had theirs checked when read); the rules across keys assume it.
        if _PLANNED_WORLD_SIZE.get() is None:
            check_own_ranges(self)
        self._check_section()
        super().__post_init__()

    def _check_section(self) -> None:
        """The rules across keys, every problem at once (MaxEntConfig adds its own first)."""
        run_checks(
            self._check_kl_coefficient,
            self._check_adaptive_kl,
            self._check_entropy_kl,
            self._check_sync_interval,
            self._check_async_generation,
            self._check_rollouts,
        )

    def _check_rollouts(self) -> None:
        lines = []
        for name in self.rollout_filters or []:
            try:
                find_filter(name)
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

    def _check_async_generation(self) -> None:
        """One generation per optimizer step, from a server, with TRL's correction."""
        if not self.async_generation:
            return
        lines = []
        if not uses_vllm_server(self):
            lines.append(
                "async_generation: true needs a vLLM server to generate while the trainers "
                "train; set use_vllm: true and vllm_mode: server, or async_generation: false"
            )
        if not self.vllm_importance_sampling_correction:
            lines.append(
                "async_generation: true with vllm_importance_sampling_correction: false: samples "
                "come from the previous policy and nothing would correct for it; set "
                "vllm_importance_sampling_correction: true"
            )
        steps = self.steps_per_generation or self.gradient_accumulation_steps
        if steps != self.gradient_accumulation_steps or self.num_iterations != 1:
            lines.append(
                f"async_generation: true needs one generation per optimizer step; "
                f"steps_per_generation {steps} and num_iterations {self.num_iterations} give "
                "another; set steps_per_generation to gradient_accumulation_steps and "
                "num_iterations: 1"
            )
        if self.max_staleness < self.vllm_sync_interval_steps:
            lines.append(
                f"max_staleness: {self.max_staleness} is below vllm_sync_interval_steps "
                f"({self.vllm_sync_interval_steps}): every sample would be too old; set "
                f"max_staleness: {self.vllm_sync_interval_steps} or more"
            )
        if lines:
            raise ConfigProblems("async_generation", lines)

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

    def _check_entropy_kl(self) -> None:
        """The KL-adaptive entropy bonus scales TRL's entropy_coef by the KL to the reference."""
        if self.entropy_kl_threshold is None:
            return
        lines = []
        if self.entropy_coef <= 0:
            lines.append(
                f"entropy_kl_threshold: {self.entropy_kl_threshold} with entropy_coef: "
                f"{self.entropy_coef}: the rule multiplies entropy_coef; set entropy_coef > 0"
            )
        if not (self.beta > 0 or self.init_kl_coeff > 0):
            lines.append(
                f"entropy_kl_threshold: {self.entropy_kl_threshold} with beta: {self.beta}: the "
                "KL is measured against the reference model, which beta > 0 loads; set beta "
                "(e.g. 0.04)"
            )
        if self.use_adaptive_entropy:
            lines.append(
                "entropy_kl_threshold with use_adaptive_entropy: true: two rules for one "
                "entropy_coef; keep one of them"
            )
        if self.entropy_kl_below == "keep" and self.entropy_kl_above == "keep":
            lines.append(
                f"entropy_kl_threshold: {self.entropy_kl_threshold} with entropy_kl_below and "
                "entropy_kl_above both keep: nothing adapts; set entropy_kl_below: raise or "
                "entropy_kl_above: lower (or off), or unset entropy_kl_threshold"
            )
        if lines:
            raise ConfigProblems("entropy_kl_threshold", lines)

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


# The number of training processes a recipe is being built for (recipe.build_recipe, from keys
# read by recipe.parser, whose ranges are checked there: not again in __post_init__).
_PLANNED_WORLD_SIZE: ContextVar[int | None] = ContextVar("planned_world_size", default=None)


@contextmanager
def planned_world_size(world_size: int) -> Iterator[None]:
    """While sections are built: GRPOConfig.world_size is `world_size` (the plan's, not 1)."""
    token = _PLANNED_WORLD_SIZE.set(world_size)
    try:
        yield
    finally:
        _PLANNED_WORLD_SIZE.reset(token)


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
