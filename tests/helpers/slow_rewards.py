"""A reward that makes steps slow from a given step on, for the graceful-stop tests.

SLOW_REWARD_AFTER_STEP=N and SLOW_REWARD_S=S: once N steps are done, every call sleeps S
seconds (a step longer than the grace time a stop gets). SLOW_REWARD_MARK=PATH: a line
"sleeping in step K" is appended to PATH as each sleep starts (a test waits for it).
"""

import os
import time


def slow_digit_fraction(completions, trainer_state=None, **kwargs):
    """The share of digits in each completion (dense), after an optional sleep."""
    after = int(os.environ.get("SLOW_REWARD_AFTER_STEP", "-1"))
    step = getattr(trainer_state, "global_step", 0)
    if after >= 0 and step >= after:
        if mark := os.environ.get("SLOW_REWARD_MARK"):
            with open(mark, "a") as file:
                file.write(f"sleeping in step {step + 1}\n")
        time.sleep(float(os.environ.get("SLOW_REWARD_S", "0")))
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]
