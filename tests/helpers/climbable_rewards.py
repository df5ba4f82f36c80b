"""Rewards an untrained tiny model can climb, for learning tests (loaded as module:function).

A strict 0/1 task reward is 0 everywhere for a random model, so loss and gradient are exactly
zero and a learning test would prove nothing. `digit_fraction` is now a built-in reward (the
smoke recipe uses it by name); this path keeps working for recipes that name it as a module.
"""

from maxent_grpo.rewards.builtin import digit_fraction

__all__ = ["digit_fraction"]
