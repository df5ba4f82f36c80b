"""A reward that asks its run to stop at a given step (loaded as module:function).

What a Slurm time-limit signal makes the launcher do (rundir/checkpoints.py request_stop: the
stop file), at a known step: the trainer saves a complete checkpoint at the end of step
MAXENT_GRPO_TEST_STOP_AT and exits for a requeue. The output dir is MAXENT_GRPO_TEST_STOP_DIR.
Scores 0 for every completion: give it weight 0 beside a real reward.
"""

import os

from maxent_grpo.rundir.checkpoints import request_stop


def stop_at_step(completions, trainer_state=None, **kwargs):
    at = int(os.environ.get("MAXENT_GRPO_TEST_STOP_AT", "0"))
    # Rewards are computed during a step: global_step counts the steps already finished.
    if at and trainer_state is not None and trainer_state.global_step + 1 == at:
        request_stop(os.environ["MAXENT_GRPO_TEST_STOP_DIR"], f"test: stop at step {at}")
    return [0.0] * len(completions)
