"""Defaults by era: the TRL version a recipe was written for, and the GRPOConfig defaults that
changed since, which `migrate` writes out with their old values so the recipe keeps its meaning.

Read from TRL's history (git log -p trl/trainer/grpo_config.py, tags v0.14.0 to v1.9.0, and the
installed 1.16.0); each row names the release that changed the default. Defaults checked and
unchanged since GRPO landed (v0.14-v0.17): epsilon 0.2 (v0.16), epsilon_high None (v0.16),
mask_truncated_completions False (v0.17), num_iterations 1 (v0.16), top_p 1.0 (v0.16),
min_p None, repetition_penalty 1.0; scale_rewards True became "group" (v0.22), the same
scaling. Not pinned (cost, not meaning): gradient_checkpointing (on since v0.22), logging_steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Version = tuple[int, ...]

#: The TRL upstream MaxEnt-GRPO pinned, trl==0.18.0 in its configs/constraints.txt.
UPSTREAM_TRL = "0.18.0"
#: The last TRL release whose GRPOConfig still had the key (it was removed in the next one):
#: a recipe that sets it was written for that release or an older one.
LAST_WITH_KEY = {
    "vllm_device": "0.17.0",  # server mode replaced it in v0.18.0
    "vllm_max_model_len": "0.17.0",
    "vllm_enable_prefix_caching": "0.17.0",
    "wandb_log_unique_prompts": "0.26.2",
    "max_prompt_length": "0.27.2",
    "use_liger_loss": "0.27.2",
    "vllm_guided_decoding_regex": "0.27.2",
}


def parse_version(text: str) -> Version:
    """'0.18' or 'v0.18.0' -> (0, 18, 0); ValueError for anything else."""
    parts = str(text).strip().removeprefix("v").split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"--trl-version {text!r}: give a release number such as 0.18.0")
    return tuple(int(p) for p in parts) + (0,) * (3 - len(parts))


def recipe_era(recipe: dict[str, Any], upstream: bool, asked: str | None) -> tuple[str, str] | None:
    """(the TRL version the recipe was written for, how that is known), or None: nothing says
    it is older than the installed TRL."""
    if asked:
        parse_version(asked)
        return asked.removeprefix("v"), "--trl-version"
    if upstream:
        return UPSTREAM_TRL, "upstream MaxEnt-GRPO's pin"
    bounds = [(parse_version(v), k, v) for k, v in LAST_WITH_KEY.items() if k in recipe]
    if not bounds:
        return None
    _, key, version = min(bounds)
    return version, f"dated by {key}, removed after it"


@dataclass(frozen=True)
class EraDefault:
    """A GRPOConfig default that changed in TRL `changed_in`: older recipes meant `value`."""

    key: str
    value: Any
    changed_in: str  # the release with the new default
    now: Any  # the installed TRL 1.16's default
    why: str
    applies: Callable[[dict[str, Any], str], bool] = lambda recipe, method: True


def _grpo_kl(recipe: dict[str, Any], method: str) -> bool:
    # MaxEnt's KL weight is init_kl_coeff; upstream's kl_target/kl_horizon adapt it
    kl_keys = ("init_kl_coeff", "init_kl_coef", "kl_target", "kl_horizon")
    return method == "grpo" and not any(k in recipe for k in kl_keys)


def _grpo(recipe: dict[str, Any], method: str) -> bool:
    return method == "grpo"  # MaxEnt-GRPO has its own loss and KL (recipe/maxent_keys.py)


def _uses_vllm(recipe: dict[str, Any], method: str) -> bool:
    return recipe.get("use_vllm") is True


def _synced_every_step(recipe: dict[str, Any], method: str) -> bool:
    # with stale weights between syncs the correction is required here (recipe/checks.py)
    return _uses_vllm(recipe, method) and recipe.get("vllm_sync_interval_steps", 1) == 1


def _beta(recipe: dict[str, Any]) -> float:
    value = recipe.get("beta", recipe.get("init_kl_coeff", 0.0))
    return value if isinstance(value, (int, float)) else 0.0


ERA_DEFAULTS = (
    EraDefault(
        "loss_type",
        "grpo",
        "0.17.0",
        "dapo",
        "before v0.17 each completion's "
        "token mean, then the batch mean (loss_type grpo); bnpo became the default",
        _grpo,
    ),
    EraDefault(
        "loss_type",
        "bnpo",
        "0.22.0",
        "dapo",
        "v0.17-v0.21 normalised by the batch's "
        "tokens per process (bnpo); dapo became the default in v0.22",
        _grpo,
    ),
    EraDefault(
        "beta", 0.04, "0.19.0", 0.0, "the KL weight was 0.04 until v0.19 made it 0.0", _grpo_kl
    ),
    EraDefault("temperature", 0.9, "0.18.0", 1.0, "sampling temperature 0.9 until v0.18"),
    EraDefault(
        "top_k",
        50,
        "0.18.0",
        0,
        "top_k 50 until v0.18 turned top-k off (None, now 0)",
        lambda recipe, method: not (_uses_vllm(recipe, method) and recipe["_before_0_16"]),
    ),
    EraDefault(
        "bf16",
        False,
        "0.19.0",
        True,
        "GRPOConfig trained in float32 unless bf16 was set, until v0.19 made bf16 the default",
    ),
    EraDefault(
        "vllm_importance_sampling_correction",
        False,
        "0.23.0",
        True,
        "v0.23 added the "
        "truncated importance-sampling correction of vLLM's sampling mismatch, on by "
        "default; before, the loss used the trainer's log-probabilities alone",
        _synced_every_step,
    ),
    EraDefault(
        "max_completion_length",
        256,
        "1.10.0",
        512,
        "256 tokens until after v1.9.0 (TRL #6264); TRL 1.16 generates up to 512",
    ),
    EraDefault(
        "use_bias_correction_kl",
        False,
        "1.10.0",
        True,
        "after v1.9.0 the KL term is "
        "weighted by the importance ratio (DeepSeek-V3.2's unbiased estimator; TRL 1.16 "
        "default true), which changes the KL gradient whenever beta > 0",
        lambda recipe, method: method == "grpo" and _beta(recipe) != 0,
    ),
)


def era_pins(recipe: dict[str, Any], method: str, era: str) -> list[EraDefault]:
    """The defaults to write out for a recipe of TRL `era`: one row per key (the oldest that
    applies), for keys the recipe leaves unset. Rows are read in order, later pins (beta)
    seeing earlier ones."""
    version = parse_version(era)
    seen = dict(recipe)
    # TRL v0.14-v0.15 sent vLLM only temperature and max_tokens: vLLM's own top_k (off) applied
    seen["_before_0_16"] = version < (0, 16, 0)
    pins: list[EraDefault] = []
    for row in ERA_DEFAULTS:
        if row.key in seen or version >= parse_version(row.changed_in):
            continue
        if row.applies(seen, method):
            pins.append(row)
            seen[row.key] = row.value
    return pins
