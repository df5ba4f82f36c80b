"""Rewards an untrained tiny model can climb, for learning tests (loaded as module:function).

A strict 0/1 task reward is 0 everywhere for a random model, so loss and gradient are exactly
zero and a learning test would prove nothing. These give a dense signal instead.
"""


def _text(completion):
    return completion[-1]["content"] if isinstance(completion, list) else completion


def digit_fraction(completions, **kwargs):
    """Fraction of the completion's characters that are digits (0 for an empty completion)."""
    scores = []
    for completion in completions:
        text = _text(completion)
        scores.append(sum(ch.isdigit() for ch in text) / len(text) if text else 0.0)
    return scores
