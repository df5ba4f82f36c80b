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

from maxent_grpo.errors import ConfigError
from maxent_grpo.recipe.converters import CONVERTERS
from maxent_grpo.recipe.declare import Accepts, check_own_ranges
from maxent_grpo.recipe.launch_keys import LauncherKeys
from maxent_grpo.recipe.rules import check_rules
from maxent_grpo.recipe.script_keys import ScriptArguments
from maxent_grpo.rollout_filters import filters_help

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
            "async/dropped_stale) and generated again. At least vllm_sync_interval_steps. "
            "It also sets how deep the pipeline runs: max_staleness - "
            "vllm_sync_interval_steps + 1 steps are generated ahead (docs: Asynchronous "
            "generation)."
        },
    )
    partial_rollout_tokens: Annotated[int, Accepts(range=(">=", 0))] = field(
        default=0,
        metadata={
            "help": "With async_generation: generate completions in chunks of this many "
            "tokens, so a weight push waits for at most one chunk in flight; unfinished "
            "completions go on from their prefixes under the new weights, and a checkpoint "
            "keeps them (docs: Asynchronous generation). 0: whole completions."
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

    # Replay (train/replay.py, docs/replay.md): trained groups re-sampled in later steps.
    replay_share: Annotated[float, Accepts(range=(">=", 0, "<", 1))] = field(
        default=0.0,
        metadata={
            "help": "The share of each generation's groups drawn from the replay buffer of "
            "groups trained in earlier steps (their prompts are not generated for); the rest "
            "is generated as usual. 0: no replay (nothing is kept, nothing costs)."
        },
    )
    replay_buffer_size: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=64,
        metadata={
            "help": "With replay_share > 0: the most groups the buffer keeps per training "
            "process; the oldest go first when it is full (counted in replay/evicted_full)."
        },
    )
    replay_priority: str = field(
        default="advantage",
        metadata={
            "help": "Which buffered groups are replayed more often (sampled by rank, without "
            "replacement): 'advantage' (mean |advantage|), 'spread' (best minus worst reward) "
            "or 'reward' (mean reward). With 'advantage' and 'spread' a group that carries no "
            "signal (all rewards equal) is never replayed.",
            "choices": ["advantage", "spread", "reward"],
        },
    )
    replay_max_age: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=4,
        metadata={
            "help": "With replay_share > 0: the most optimizer steps a replayed group's policy "
            "may be behind the one that trains on it; older groups are evicted (counted in "
            "replay/evicted_age)."
        },
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
    oversample_keep: str = field(
        default="first",
        metadata={
            "help": "Which of a step's kept groups it trains on when it holds more than it "
            "needs (oversample_factor, carry-over): 'first' (carried groups, then in the order "
            "generated) or 'best' (the largest reward standard deviation first; the next best "
            "are carried over, a carried group at most once). docs/rollouts.md has the figures.",
            "choices": ["first", "best"],
        },
    )
    rollout_func: str | None = field(
        default=None,
        metadata={
            "help": "Your own rollout function, 'module:function(prompts, trainer) -> dict', "
            "passed to TRL's GRPOTrainer as rollout_func: it generates each step's completions "
            "instead of TRL (e.g. maxent_grpo.train.rollout_func:self_check, a two-turn "
            "self-check). Not with async_generation, tools or environment (docs/rollouts.md)."
        },
    )

    METHOD = "grpo"  # the rules of recipe/rules.py this section follows

    def __post_init__(self):
        # Each value in its own range first (only for a section built directly: build_recipe's
        # keys had theirs checked when read); the rules across keys (recipe/rules.py, which
        # the launcher runs on the keys too) assume it.
        if _PLANNED_WORLD_SIZE.get() is None:
            check_own_ranges(self)
        check_rules(self, _PLANNED_WORLD_SIZE.get(), self.METHOD)
        self._set_beta()
        super().__post_init__()

    def _set_beta(self) -> None:
        """GRPO: init_kl_coeff is TRL's beta (MaxEntConfig: always)."""
        if self.init_kl_coeff > 0:
            self.beta = self.init_kl_coeff

    @property
    def world_size(self) -> int:
        """The planned number of training processes while a recipe is built for it (TRL's
        checks read this in `__post_init__`), else the running job's (transformers')."""
        planned = _PLANNED_WORLD_SIZE.get()
        return planned if planned is not None else super().world_size


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
