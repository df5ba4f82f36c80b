"""Failpoints: SIGKILL this process at a named point, for the reliability tests.

Set MAXENT_GRPO_FAILPOINT=<point>[:<step>][:<action>] (e.g. `checkpoint_partial:4`). Unset
(always, in real runs) it costs one dict lookup per call. A SIGKILL cannot be caught, so what
the tests see afterwards is exactly what a node failure or an OOM kill would leave on disk.
Actions: `kill` (the default, SIGKILL), `error` (raise RuntimeError: a crash), `oom` (raise
torch.OutOfMemoryError, the exception a CUDA allocation failure raises: the out-of-memory
class on a machine without a GPU), `skip` (return True: the caller leaves out what the point
guards).

Points: train_start (before step 1), step_begin (inside a step), checkpoint_partial (model
written, optimizer not yet), checkpoint_unmarked (all files written, marker not yet),
final_save (final model written, completion marker not yet), resume_restart (`skip`: start
from scratch instead of resuming from the last complete checkpoint; the GPU kit's test).
"""

from __future__ import annotations

import os
import signal

ENV = "MAXENT_GRPO_FAILPOINT"


def failpoint(point: str, step: int | None = None) -> bool:
    spec = os.environ.get(ENV)
    if not spec:
        return False
    name, _, rest = spec.partition(":")
    at, _, action = rest.partition(":")
    if name != point or not (not at or step is None or int(at) == step):
        return False
    if action == "skip":
        return True
    if action == "error":
        raise RuntimeError(f"failpoint {point} at step {step}")
    if action == "oom":
        import torch

        raise torch.OutOfMemoryError(f"failpoint {point}: CUDA out of memory (stand-in)")
    os.kill(os.getpid(), signal.SIGKILL)
    return False
