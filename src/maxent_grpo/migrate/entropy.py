"""Upstream MaxEnt-GRPO's entropy bonuses -> TRL's entropy_coef (a rule of `migrate`).

Upstream trained two kinds (liv-daliberti/maxent-grpo, before commit 955c288):
- objective maxent_entropy (or maxent_objective_variant: entropy without the GRPO flag): the
  clipped GRPO loss minus maxent_alpha x the policy entropy divided by ln(vocabulary), alpha
  scaled per micro-batch by the KL to the reference (maxent_alpha_raise_on_low_kl, ...).
  Here: entropy_coef, entropy_normalize_by_max and the `entropy_kl_*` keys (train/entropy_kl.py,
  the same rule).
- GRPO with policy_entropy_bonus_coef > 0: the completion's mean token entropy added to its
  reward before the group's normalisation. Here: the same coefficient as TRL's loss-side
  entropy_coef (it pushes entropy the same way with another estimator and scale: listed as a
  behaviour difference).
"""

from __future__ import annotations

from typing import Any

from maxent_grpo.migrate.edits import Change, Edits, Key, to_yaml
from maxent_grpo.migrate.kinds import is_number
from maxent_grpo.migrate.upstream import ORIGIN

_FLAGS = (
    "maxent_alpha_raise_on_low_kl",
    "maxent_alpha_lower_on_high_kl",
    "maxent_alpha_disable_outside_trust_zone",
)
# upstream key -> (our key, upstream's default, which ours shares)
_KL_NUMBERS = {
    "maxent_alpha_kl_gain": ("entropy_kl_gain", 1.0),
    "maxent_alpha_kl_min_multiplier": ("entropy_kl_min_multiplier", 0.5),
    "maxent_alpha_kl_max_multiplier": ("entropy_kl_max_multiplier", 2.0),
}
_KL_WEIGHTS = ("beta", "init_kl_coeff", "init_kl_coef")
KEYS = ("maxent_alpha", "policy_entropy_bonus_coef", "maxent_alpha_kl_threshold")
KEYS += _FLAGS + tuple(_KL_NUMBERS)


def entropy_loss(recipe: dict[str, Any]) -> bool:
    """Upstream's entropy-regularised objective, said explicitly."""
    objective = str(recipe.get("objective", "")).strip().lower()
    variant = str(recipe.get("maxent_objective_variant", "")).strip().lower()
    if objective:
        return objective == "maxent_entropy"
    return variant == "entropy" and recipe.get("train_grpo_objective") is not True


def _bonus_keys(recipe: dict[str, Any]) -> dict[str, Any]:
    """Our keys for the recipe's entropy bonus; {} when it has none."""
    if entropy_loss(recipe):
        alpha = recipe.get("maxent_alpha", 1.0)  # upstream's default for its MaxEnt objectives
        if not (is_number(alpha) and alpha > 0):
            return {}
        out: dict[str, Any] = {"entropy_coef": alpha, "entropy_normalize_by_max": True}
        flags = {f: recipe.get(f) is True for f in _FLAGS}
        if any(flags.values()):
            out["entropy_kl_threshold"] = recipe.get("maxent_alpha_kl_threshold", 0.04)
            if flags["maxent_alpha_raise_on_low_kl"]:
                out["entropy_kl_below"] = "raise"
            if flags["maxent_alpha_disable_outside_trust_zone"]:
                out["entropy_kl_above"] = "off"
            elif flags["maxent_alpha_lower_on_high_kl"]:
                out["entropy_kl_above"] = "lower"
            for old, (new, default) in _KL_NUMBERS.items():
                if recipe.get(old, default) != default:
                    out[new] = recipe[old]
        return out
    coef = recipe.get("policy_entropy_bonus_coef", 0)
    return {"entropy_coef": coef} if is_number(coef) and coef > 0 else {}


def _has_kl_penalty(recipe: dict[str, Any]) -> bool:
    """False when the recipe sets its KL weight to 0 (unset: the era's default decides)."""
    kl_weight = next((recipe[k] for k in _KL_WEIGHTS if k in recipe), None)
    return kl_weight is None or (is_number(kl_weight) and kl_weight > 0)


def _why(recipe: dict[str, Any], new: dict[str, Any]) -> tuple[str, bool]:
    """What the translation keeps and what it changes, and whether training differs."""
    if "entropy_normalize_by_max" not in new:
        return (
            "upstream added the completion's mean entropy to its reward before the group's "
            "normalisation; TRL subtracts it from the loss: the same push toward entropy, "
            "another estimator and scale",
            True,
        )
    kl = "" if "entropy_kl_threshold" not in new else ", scaled by the same KL rule"
    if str(recipe.get("grpo_loss_type", recipe.get("loss_type", ""))).lower() == "bnpo":
        return f"upstream's entropy term: the mean token entropy / ln(vocabulary){kl}", False
    return (
        f"upstream's entropy term / ln(vocabulary){kl}; upstream averaged the entropy per "
        "completion first, TRL over all tokens (longer completions weigh more)",
        True,
    )


def migrate_entropy_bonus(edits: Edits, keys: dict[str, Key], recipe: dict[str, Any]) -> set[str]:
    """The entropy-bonus keys -> ours, written after the first of them; the keys handled."""
    present = [k for k in KEYS if k in keys]
    new = _bonus_keys(recipe)
    if not present or not new:
        return set()
    if "entropy_kl_threshold" in new and not _has_kl_penalty(recipe):
        new = {k: v for k, v in new.items() if not k.startswith("entropy_kl_")}
        text = "the KL rule of the entropy bonus (it measures the KL of beta > 0's penalty)"
        edits.changes.append(Change("maxent_alpha_kl_threshold", True, text, True))
    why, differs = _why(recipe, new)
    written = ", ".join(f"{k}: {to_yaml(v)}" for k, v in new.items())
    for key in present:
        text = f"{key}: {to_yaml(recipe[key])} -> {written} ({ORIGIN}: {why})"
        if key != present[0]:
            text = f"{key}: {to_yaml(recipe[key])}, read into the entropy keys above"
        edits.comment_out(keys[key], Change(key, False, text, differs and key == present[0]))
    first = keys[present[0]]
    edits.after.setdefault(first.last, []).extend(f"{k}: {to_yaml(v)}" for k, v in new.items())
    return set(present)
