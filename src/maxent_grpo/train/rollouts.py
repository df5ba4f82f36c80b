"""Generation rounds and carry-over: the decisions, without TRL or torch.

A *group* is one prompt's `num_generations` completions. After scoring, each group goes through
the recipe's `rollout_filters` (maxent_grpo/rollout_filters.py: the filters, by name); the step
trains on the groups that pass. While a step has fewer than it needs, another round is
generated, at most `max_generation_rounds` in all; survivors beyond what the step needs are
carried over to the next step. The trainer side (tensors, processes, checkpoints) is
`train/rollout_rounds.py`; docs/rollouts.md explains the keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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


def group_signal(rewards: list[float]) -> float:
    """A group's signal: the standard deviation of its scored rewards (NaN: unscored), the
    size of its advantages before TRL scales them; for a 0/1 reward, largest at half right."""
    scored = [r for r in rewards if r == r]
    if len(scored) < 2:
        return 0.0
    mean = sum(scored) / len(scored)
    return math.sqrt(sum((r - mean) ** 2 for r in scored) / len(scored))


def choose_groups(
    signals: list[float], carried_in: int, usable: int, need: int, keep: str, skip: bool
) -> tuple[list[int], list[int], list[int]]:
    """Indices into a step's pool (its `carried_in` carried groups first, then each round's kept
    groups in order): (trained, carried over, dropped). 'first' trains the pool's first
    `usable`; 'best' the `usable` of largest signal (ties: pool order), and drops a carried
    group that loses again, so none is more than one step old. At most `need` carried over."""
    order = list(range(len(signals)))
    if keep == "best":
        order.sort(key=lambda i: -signals[i])  # stable: ties keep the pool's order
    trained = [] if skip else order[:usable]
    rest = order[len(trained) :]
    stale = [i for i in rest if i < carried_in] if keep == "best" and trained else []
    rest = [i for i in rest if i not in stale]
    return trained, rest[:need], rest[need:] + stale


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
    signal_trained: float = 0.0  # summed over the trained groups (their mean in the metric)

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
            "rollouts/signal_trained": self.signal_trained / self.trained if self.trained else 0.0,
        }
        for name, count in per_filter.items():
            out[f"rollouts/kept_fraction/{name}"] = (
                count / self.generated if self.generated else 0.0
            )
        return out
