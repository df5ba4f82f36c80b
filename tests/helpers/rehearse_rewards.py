"""Rewards broken on purpose for `maxent-grpo rehearse`'s tests (loaded as module:function)."""


def raises_on_odd(completions, solution=None, **kwargs):
    """Raises on the rows whose answer is odd (about half of them, not all)."""
    if any(str(s).strip()[-1:] in "13579" for s in solution or []):
        raise KeyError("no score for odd answers")
    return [float(len(str(c))) for c in completions]


def always_one(completions, **kwargs):
    """The same score for every completion: no signal."""
    return [1.0] * len(completions)
