"""A reward that is slow only in a run that started from step 0, for the requeue tests.

FRESH_START_REWARD_S=S: in a process whose first reward call comes at step 0 (a fresh start),
every call sleeps S seconds; in a process that resumed from a checkpoint (first call after
step 0), none does. So the first attempt idles while the test waits for Slurm (a time-limit
tick, a grace time, a kill) instead of burning a core per trainer on steps that only fill the
wait, and the resumed attempt trains the rest at full speed. The values (the share of digits
in each completion) are the same with or without the sleep: an uninterrupted run without the
variable is the reference.
"""

import os
import time

_first_step: int | None = None  # the step of this process's first call


def digit_fraction_slow_fresh_start(completions, trainer_state=None, **kwargs):
    """The share of digits in each completion (dense), after a sleep in a fresh start."""
    global _first_step
    step = getattr(trainer_state, "global_step", 0)
    if _first_step is None:
        _first_step = step
    if _first_step == 0:
        time.sleep(float(os.environ.get("FRESH_START_REWARD_S", "0")))
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]
