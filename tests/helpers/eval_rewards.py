"""Rewards for the evaluation tests whose scores can be worked out by hand (imported as
`tests.helpers.eval_rewards:NAME` in recipes)."""

from __future__ import annotations


def solution_is_yes(completions, solution=None, **kwargs):
    """1.0 for every completion of a problem whose reference is 'yes', else 0.0: a benchmark's
    score is the share of 'yes' problems, whatever the model writes."""
    return [1.0 if str(ref).strip() == "yes" else 0.0 for ref in solution]
