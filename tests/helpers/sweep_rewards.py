"""A reward module that cannot be loaded on one sweep point only (loaded as module:function).

The launcher of a sweep's array task marks its environment with the point (launch/slurm.py
SWEEP_ENV, "<sweep>:<index>"); the trainers inherit it. On point 0 importing this module fails,
which the trainers report as a user error (permanent: not retried); on every other point, and
in `maxent-grpo sweep`'s own check, the reward loads and scores a constant.
"""

import os

if os.environ.get("MAXENT_GRPO_SWEEP_POINT", "").endswith(":0"):
    raise RuntimeError("sweep_rewards: point 0 cannot load this reward, on purpose (test)")


def constant(completions, **kwargs):
    return [0.0] * len(completions)
