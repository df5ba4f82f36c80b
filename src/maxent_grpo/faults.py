"""Failpoints: SIGKILL this process at a named point, for the reliability tests.

Set MAXENT_GRPO_FAILPOINT=<point>[:<step>][:<action>] (e.g. `checkpoint_partial:4`). Unset
(always, in real runs) it costs one dict lookup per call. A SIGKILL cannot be caught, so what
the tests see afterwards is exactly what a node failure or an OOM kill would leave on disk.
Actions: `kill` (the default, SIGKILL), `error` (raise RuntimeError: a crash), `oom` (raise
torch.OutOfMemoryError, the exception a CUDA allocation failure raises: the out-of-memory
class on a machine without a GPU), `skip` (return True: the caller leaves out what the point
guards), `pause` (append "<pid> <point> <step>" to the file MAXENT_GRPO_FAILPOINT_HITS names,
then SIGSTOP this process, once per process and point: it stands still there until a SIGCONT,
while the chaos campaign, bench/chaos.py, puts its fault in at exactly that moment).

Points: train_start (before step 1), step_begin (inside a step), checkpoint_partial (model
written, optimizer not yet), checkpoint_unmarked (all files written, marker not yet),
final_save (final model written, completion marker not yet), resume_restart (`skip`: start
from scratch instead of resuming from the last complete checkpoint; the GPU kit's test),
data_order (`skip`: the train sampler is seeded off by one, so it draws another order;
`maxent-grpo rehearse`'s test of its data-order row).
The moments of a run's life, for the chaos campaign: generation and scoring (the step's
rollouts, before they are generated and before they are scored), weight_push (before the
trainer's weights go to the vLLM server), optimizer_step (gradients done, before the update),
server_start (the launcher, the vLLM or reward-model server just started, not yet healthy),
evaluation (before a checkpoint's benchmarks run), teardown (the launcher, training over,
before it stops what is left). Each takes the step it is in where there is one.
"""

from __future__ import annotations

import os
import signal

ENV = "MAXENT_GRPO_FAILPOINT"
HITS_ENV = "MAXENT_GRPO_FAILPOINT_HITS"
_paused: set[str] = set()


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
    if action == "pause":
        if point not in _paused:  # once per process: a point without a step recurs
            _paused.add(point)
            _pause(point, step)
        return False
    if action == "error":
        raise RuntimeError(f"failpoint {point} at step {step}")
    if action == "oom":
        import torch

        raise torch.OutOfMemoryError(f"failpoint {point}: CUDA out of memory (stand-in)")
    os.kill(os.getpid(), signal.SIGKILL)
    return False


def _pause(point: str, step: int | None) -> None:
    """Say where this process stands (one write: appenders on several processes do not
    interleave), then stop until the campaign continues it."""
    hits = os.environ.get(HITS_ENV)
    if hits:
        fd = os.open(hits, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{os.getpid()} {point} {step}\n".encode())
        finally:
            os.close(fd)
    os.kill(os.getpid(), signal.SIGSTOP)
