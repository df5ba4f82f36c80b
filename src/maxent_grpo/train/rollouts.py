"""Rollout filters, generation rounds and carry-over: the decisions, without TRL or torch.

A *group* is one prompt's `num_generations` completions. After scoring, each group goes through
the recipe's `rollout_filters`; the step trains on the groups that pass. While a step has fewer
than it needs, another round is generated, at most `max_generation_rounds` in all; survivors
beyond what the step needs are carried over to the next step. The trainer side (tensors,
processes, checkpoints) is `train/rollout_mixin.py`; docs/rollouts.md explains the keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from maxent_grpo.recipe.keys import ROLLOUT_FILTERS, import_filter

# Reward spread below this counts as none (rewards are float32 in TRL).
SPREAD_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Group:
    """What a filter sees of one group: one entry per completion."""

    prompts: Sequence[str]
    completions: Sequence[str]
    rewards: Sequence[float]  # NaN where no reward function scored the completion
    lengths: Sequence[int]  # completion tokens
    truncated: Sequence[bool]  # ended without EOS (hit max_completion_length)


@dataclass(frozen=True)
class FilterSettings:
    min_reward: float = 0.0
    min_length: int = 0
    max_length: int | None = None
    drop_truncated: bool = False


GroupFilter = Callable[[Group, FilterSettings], bool]


def _scored(rewards: Sequence[float]) -> list[float]:
    return [r for r in rewards if not math.isnan(r)]


def nonzero_std(group: Group, settings: FilterSettings) -> bool:
    """Some reward differs from another: the group has an advantage to learn from."""
    scored = _scored(group.rewards)
    return len(scored) >= 2 and max(scored) - min(scored) > SPREAD_TOLERANCE


def min_reward(group: Group, settings: FilterSettings) -> bool:
    """The best completion reaches rollout_min_reward."""
    scored = _scored(group.rewards)
    return bool(scored) and max(scored) >= settings.min_reward


def diverse(group: Group, settings: FilterSettings) -> bool:
    """Not every completion is the same text."""
    return len(set(group.completions)) > 1


def length(group: Group, settings: FilterSettings) -> bool:
    """Every completion within [rollout_min_length, rollout_max_length] tokens and, with
    rollout_drop_truncated, none cut off at max_completion_length."""
    upper = settings.max_length if settings.max_length is not None else math.inf
    if any(not settings.min_length <= n <= upper for n in group.lengths):
        return False
    return not (settings.drop_truncated and any(group.truncated))


BUILTIN_FILTERS: dict[str, GroupFilter] = {
    "nonzero_std": nonzero_std,
    "min_reward": min_reward,
    "diverse": diverse,
    "length": length,
}
assert tuple(BUILTIN_FILTERS) == ROLLOUT_FILTERS  # the names are declared with the key


def _custom(function: Callable) -> GroupFilter:
    """A user's `module:function(prompts, completions, rewards) -> bool`."""

    def run(group: Group, settings: FilterSettings) -> bool:
        return bool(function(list(group.prompts), list(group.completions), list(group.rewards)))

    return run


def resolve_filter(name: str) -> GroupFilter:
    """A built-in name or an importable `module:function` (checked by recipe/keys.py)."""
    function = import_filter(name)
    return BUILTIN_FILTERS[name] if function is None else _custom(function)


def resolve_filters(names: Sequence[str]) -> dict[str, GroupFilter]:
    return {name: resolve_filter(name) for name in names}


def apply_filters(
    groups: Sequence[Group], filters: dict[str, GroupFilter], settings: FilterSettings
) -> tuple[list[bool], dict[str, int]]:
    """Keep flags (a group is kept when every filter keeps it) and, per filter, how many
    groups it alone would keep (for `rollouts/kept_fraction/<filter>`)."""
    passed = {name: [bool(f(g, settings)) for g in groups] for name, f in filters.items()}
    keep = [all(flags[i] for flags in passed.values()) for i in range(len(groups))]
    return keep, {name: sum(flags) for name, flags in passed.items()}


def round_sizes(needed: int, oversample_factor: float) -> tuple[int, int]:
    """(groups in the first round, groups in each later round) for a step needing `needed`."""
    return max(needed, math.ceil(needed * oversample_factor)), needed


def usable_groups(kept: int, group_size: int, micro_batches: int) -> int:
    """How many of `kept` groups a step can train on: their completions must split evenly into
    the step's `steps_per_generation` micro-batches (TRL's split drops a remainder)."""
    for groups in range(kept, 0, -1):
        if (groups * group_size) % micro_batches == 0:
            return groups
    return 0


@dataclass
class StepTally:
    """One generation step's counts, summed over processes, for the step's metrics."""

    generated: int = 0
    kept: int = 0
    rounds: int = 0
    carried_in: int = 0
    trained: int = 0
    carried_out: int = 0
    dropped: int = 0
    skipped: bool = False

    def metrics(self, per_filter: dict[str, int]) -> dict[str, float]:
        out = {
            "rollouts/groups_generated": float(self.generated),
            "rollouts/groups_kept": float(self.kept),
            "rollouts/rounds": float(self.rounds),
            "rollouts/carried_in": float(self.carried_in),
            "rollouts/groups_trained": float(self.trained),
            "rollouts/carried_out": float(self.carried_out),
            "rollouts/groups_dropped": float(self.dropped),
            "rollouts/skipped": float(self.skipped),
        }
        for name, count in per_filter.items():
            out[f"rollouts/kept_fraction/{name}"] = (
                count / self.generated if self.generated else 0.0
            )
        return out
