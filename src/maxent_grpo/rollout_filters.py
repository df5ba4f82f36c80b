"""The rollout filters, by name: what each keeps and how a name finds its filter.

A *group* is one prompt's `num_generations` completions; a filter says whether the step trains
on it. The recipe key `rollout_filters` names them (its help and its check read this module),
and the trainer applies them (train/rollout_rounds.py; rounds and carry-over: train/rollouts.py).
A leaf, standard library only, so the recipe layer and the trainer share one registry.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from maxent_grpo.errors import ConfigError

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
    """rewards differ"""
    scored = _scored(group.rewards)
    return len(scored) >= 2 and max(scored) - min(scored) > SPREAD_TOLERANCE


def min_reward(group: Group, settings: FilterSettings) -> bool:
    """best reward >= rollout_min_reward"""
    scored = _scored(group.rewards)
    return bool(scored) and max(scored) >= settings.min_reward


def diverse(group: Group, settings: FilterSettings) -> bool:
    """not all completions identical"""
    return len(set(group.completions)) > 1


def length(group: Group, settings: FilterSettings) -> bool:
    """rollout_min_length..rollout_max_length tokens; rollout_drop_truncated"""
    upper = settings.max_length if settings.max_length is not None else math.inf
    if any(not settings.min_length <= n <= upper for n in group.lengths):
        return False
    return not (settings.drop_truncated and any(group.truncated))


#: The built-in filters by name; each docstring is its line in the key's help.
BUILTIN_FILTERS: dict[str, GroupFilter] = {
    f.__name__: f for f in (nonzero_std, min_reward, diverse, length)
}


def _custom(function: Callable) -> GroupFilter:
    """A user's `module:function(prompts, completions, rewards) -> bool`."""

    def run(group: Group, settings: FilterSettings) -> bool:
        return bool(function(list(group.prompts), list(group.completions), list(group.rewards)))

    return run


def find_filter(name: str) -> GroupFilter:
    """A built-in name or an importable `module:function`; a ConfigError (one line) otherwise.
    The recipe's check and the trainer both call this."""
    if name in BUILTIN_FILTERS:
        return BUILTIN_FILTERS[name]
    if ":" not in name:
        raise ConfigError(
            f"rollout_filters: unknown filter {name!r}; built in: {', '.join(BUILTIN_FILTERS)}, "
            "or module:function"
        )
    module_name, _, attr = name.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"rollout_filters: cannot import {name!r} ({exc})") from None
    if not callable(function):
        raise ConfigError(f"rollout_filters: {name!r} is not callable")
    return _custom(function)


def resolve_filters(names: Sequence[str]) -> dict[str, GroupFilter]:
    return {name: find_filter(name) for name in names}


def apply_filters(
    groups: Sequence[Group], filters: dict[str, GroupFilter], settings: FilterSettings
) -> tuple[list[bool], dict[str, int]]:
    """Keep flags (a group is kept when every filter keeps it) and, per filter, how many
    groups it alone would keep (for `rollouts/kept_fraction/<filter>`)."""
    passed = {name: [bool(f(g, settings)) for g in groups] for name, f in filters.items()}
    keep = [all(flags[i] for flags in passed.values()) for i in range(len(groups))]
    return keep, {name: sum(flags) for name, flags in passed.items()}


def filters_help() -> str:
    """The built-in filters in words, for the key's help: 'name (what it keeps), ...'."""
    return ", ".join(f"{name} ({f.__doc__})" for name, f in BUILTIN_FILTERS.items())
