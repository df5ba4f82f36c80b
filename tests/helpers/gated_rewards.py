"""A reward that holds the trainers while a file exists, for the server failover test.

GATE_REWARD_FILE=PATH: while PATH exists, each call waits (polling, at most GATE_REWARD_MAX_S,
default 600 s) before scoring; SLOW_REWARD_S=S: every call also sleeps S seconds. The test
creates the file to pause training at a step boundary (the trainers sleep, the CPU is free
for a restarting server) and removes it to let the run go on.
"""

import os
import time


def gated_digit_fraction(completions, **kwargs):
    """The share of digits in each completion (dense), after the gate opens."""
    gate = os.environ.get("GATE_REWARD_FILE")
    deadline = time.monotonic() + float(os.environ.get("GATE_REWARD_MAX_S", "600"))
    while gate and os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(float(os.environ.get("SLOW_REWARD_S", "0")))
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]
