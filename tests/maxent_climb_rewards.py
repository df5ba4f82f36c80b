"""Rewards an untrained tiny model can climb, for the MaxEnt learning test.

Passed to the trainer as `path/to/maxent_climb_rewards.py:digit_fraction` in reward_funcs; the
function is the built-in reward `digit_fraction`, which recipes can also name directly.
"""

from maxent_grpo.rewards.builtin import digit_fraction

__all__ = ["digit_fraction"]
