"""How an attempt ends: its class (launch/outcomes.py's rules), the outcome event, a permanent
failure remembered for the array's later tasks, a requeue under Slurm.

`Ending` is built by launch/attempt.py's Attempt once the run's output_dir is known, with what
it needs (the job, output_dir, whether a stop requeues, and how to read a signal that arrives
while it waits); the attempt hands it the stop it knows of when training ends. It keeps
`requeued` (the job runs again).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from maxent_grpo.launch.outcomes import STOP_CLASSES, Outcome, classify, is_permanent
from maxent_grpo.launch.slurm import (
    SlurmJob,
    job_record,
    node_down_wait_s,
    requeue,
    should_requeue,
    slurm_verdict,
    slurmd_timeout,
)
from maxent_grpo.launch.watch import Watched
from maxent_grpo.rundir.checkpoints import (
    last_complete_checkpoint,
    list_checkpoints,
    stop_request_reason,
    stop_requested,
)
from maxent_grpo.rundir.events import emit, read_events
from maxent_grpo.rundir.summary import run_summary


class Ending:
    """How one attempt ends (see the module docstring)."""

    def __init__(
        self,
        job: SlurmJob | None,
        output_dir: Path,
        requeue_on_stop: bool,
        late_signal: Callable[[], int | None],
    ):
        self.job = job
        self.output_dir = output_dir
        self.requeue_on_stop = requeue_on_stop
        self.late_signal = late_signal  # a stop signal that came while finishing, or None
        self.requeued = False  # the job runs again: Slurm requeued it, or accepted our requeue

    def emit_outcome(self, outcome: str, reason: str, code: int, requeue=None) -> None:
        complete = [c.step for c in list_checkpoints(self.output_dir) if c.complete]
        try:
            emit(
                self.output_dir,
                "outcome",
                outcome=outcome,
                reason=reason.splitlines()[0] if reason else "",
                code=code,
                step=complete[-1] if complete else None,
                requeue=requeue,
            )
        except OSError as exc:  # a full disk: the requeue and the exit code still follow
            # (found by bench/chaos.py: a traceback here, and under Slurm no requeue)
            print(f"warning: outcome not recorded in the event log: {exc}", flush=True)

    def classify(
        self,
        watched: Watched,
        previous: dict | None,
        train_log: Path,
        stop_reason: str | None,
        stop_signal: int | None,
    ) -> tuple[Outcome, str | None]:
        """The attempt's class, and its stop's reason (also one the trainers asked for:
        a stop request file the launcher did not write)."""
        if stop_reason is None and stop_requested(self.output_dir):
            stop_reason = stop_request_reason(self.output_dir)
        stop = None
        if stop_reason is not None:
            name = signal.Signals(stop_signal).name if stop_signal else None
            restarts = self.job.restart_count if self.job else 0
            stop = (stop_reason, name, job_record(self.job), restarts)
        return classify(self.output_dir, watched, stop, previous, train_log), stop_reason

    def finish(
        self, outcome: Outcome, max_requeues: int, marker: Path | None, stop_reason: str | None
    ) -> int:
        """Record the outcome; requeue a transient one under Slurm; remember a permanent one."""
        if outcome.kind == "completed":
            print(f"model: {self.output_dir}")
            self.emit_outcome(outcome.kind, outcome.reason, 0)
            checkpoint = last_complete_checkpoint(self.output_dir)
            print(run_summary(list(read_events(self.output_dir)), checkpoint), flush=True)
            return 0
        checkpoint = last_complete_checkpoint(self.output_dir)
        if outcome.kind in STOP_CLASSES:
            print(f"stopped ({stop_reason}); resume point: {checkpoint or 'none yet'}")
        else:
            print(f"{outcome.kind}: {outcome.reason}", flush=True)
            print(f"resume point: {checkpoint or 'none yet'}", flush=True)
        if outcome.kind == "user_error":
            # Found by the trainers' checks (prepare() leaves TRL's, rewards' and data's to
            # them): the same one line on stderr as a problem prepare() finds.
            print(f"error: {outcome.reason}", file=sys.stderr, flush=True)
        if is_permanent(outcome):
            if marker is not None:  # later tasks of the array exit at once with this line
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(f"{outcome.kind}: {outcome.reason}\n")
            print(f"not retried: {outcome.kind} is permanent", flush=True)
            self.emit_outcome(outcome.kind, outcome.reason, outcome.code)
        elif self.requeue_on_stop:
            self._requeue(outcome, max_requeues)
        else:
            self.emit_outcome(outcome.kind, outcome.reason, outcome.code)
        return outcome.code

    def _requeue(self, outcome: Outcome, max_requeues: int) -> None:
        """Requeue this job under Slurm when allowed, recording the outcome first."""
        if outcome.requeued_by_slurm:  # (a preemption with PreemptMode=REQUEUE)
            self._requeued_by_slurm(outcome)
            return
        if outcome.kind == "stopped" and self.job is not None:
            # A stop of Slurm's own (scancel: the job is CANCELLED): never requeued behind the
            # user; the checkpoint the stop made is kept (bench/chaos.py --slurm found it).
            ended = slurm_verdict(job_record(self.job), self.job.restart_count)
            if ended is not None and ended != "requeued":
                print(f"not requeued: Slurm {ended}", flush=True)
                self.emit_outcome(outcome.kind, outcome.reason, outcome.code)
                return
        ok, why = should_requeue(self.job, max_requeues)
        if not ok:
            print(f"not requeued: {why}", flush=True)
            self.emit_outcome(outcome.kind, outcome.reason, outcome.code)
            return
        target = self.job.requeue_target
        # Said and recorded first: Slurm may stop this process once the requeue is accepted.
        self.emit_outcome(outcome.kind, outcome.reason, outcome.code, requeue=target)
        verdict = self._await_node_down(outcome.silent_hosts) if outcome.silent_hosts else None
        if verdict == "requeued":
            self._requeued_by_slurm(outcome, recorded=True)
            return
        if verdict is not None:  # Slurm ended the job (scancel, NODE_FAIL without --requeue)
            print(f"not requeued: Slurm {verdict}", flush=True)
            self.emit_outcome(outcome.kind, outcome.reason, outcome.code)
            return
        print(f"requeueing {target}", flush=True)
        result = requeue(self.job)
        self.requeued = result.returncode == 0
        if result.returncode != 0:
            print(f"error: scontrol requeue failed: {result.stderr.strip()}", flush=True)
            # The reader takes an attempt's last outcome: this one says "not requeued".
            self.emit_outcome(outcome.kind, outcome.reason, outcome.code)

    def _requeued_by_slurm(self, outcome: Outcome, recorded: bool = False) -> None:
        target = self.job.requeue_target
        print(f"Slurm requeued {target} itself; it resumes from the last checkpoint", flush=True)
        if not recorded:  # (the outcome, naming the requeue, is in the event log already)
            self.emit_outcome(outcome.kind, outcome.reason, outcome.code, requeue=target)
        self.requeued = True

    def _await_node_down(self, hosts: tuple[str, ...], poll: float = 2.0) -> str | None:
        """Wait until Slurm has marked the silent hosts DOWN, which requeues or ends the job
        (slurm_verdict), at most node_down_wait_s of its SlurmdTimeout: a requeue of ours
        before that breaks the job's GPU records (launch/slurm.py). None: Slurm did nothing
        in that time (or the time limit's warning came), so this launcher requeues."""
        limit = node_down_wait_s(slurmd_timeout())
        names = ", ".join(hosts)
        print(f"waiting up to {limit:.0f}s for Slurm to mark {names} down and requeue the job")
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and self.late_signal() != signal.SIGUSR1:
            verdict = slurm_verdict(job_record(self.job), self.job.restart_count)
            if verdict is not None:
                return verdict
            time.sleep(poll)
        if self.late_signal() == signal.SIGUSR1:
            print("the time limit is near: requeueing now", flush=True)
        else:
            print(f"Slurm did not mark {names} down in {limit:.0f}s: requeueing", flush=True)
        return None
