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
