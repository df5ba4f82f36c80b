"""Reward functions that misbehave on some samples, for the reward failure-policy tests."""

import time


def raises_on_odd(completions, solution, **kwargs):
    """1.0 per completion, but raises for any batch holding an odd reference answer."""
    if any(int(s) % 2 == 1 for s in solution):
        raise ValueError("cannot score odd answers")
    return [1.0] * len(completions)


def hangs_on_odd(completions, solution, **kwargs):
    """1.0 per completion, but never returns for a batch holding an odd answer."""
    if any(int(s) % 2 == 1 for s in solution):
        time.sleep(3600)
    return [1.0] * len(completions)
