"""Rewards an untrained tiny model can climb, for the MaxEnt learning test.

Passed to the trainer as `path/to/maxent_climb_rewards.py:digit_fraction` in reward_funcs.
"""

from __future__ import annotations


def digit_fraction(completions, **kwargs) -> list[float]:
    """Fraction of the non-space characters of the completion that are digits (0 to 1)."""
    out = []
    for completion in completions:
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        chars = [c for c in text if not c.isspace()]
        out.append(sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0)
    return out
