"""How an attempt ended: its class, a one-line reason, and whether another attempt can help.

Pure functions of what the launcher saw (signals, the watchdog, the trainers' exit reports,
the end of the train log, Slurm's record of the job, the previous attempt's outcome). The
classes (docs/troubleshooting.md, "Why an attempt ended"):

  completed     the run is done
  user_error    permanent: the recipe or the allocation is wrong; the reason says what
  oom           permanent: out of memory; the reason says which keys to lower
  preempted     Slurm preempted the job (SIGTERM, the job has a PreemptTime)
  time_limit    the time limit's warning signal (SIGUSR1 from training.sh) or TIMEOUT
  stopped       asked to stop: the stop file, Ctrl-C, SIGTERM outside Slurm, scancel
  hang          no progress for hang_timeout seconds (launch/hang.py)
  crash         a process failed; the same error twice in a row is permanent
  node_failure  a node of the job failed (Slurm said so)
  reward_server_lost  the reward-model server died mid-run; twice in a row is permanent

Requeues and array retries are spent only on transient classes.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.errors import EXIT_CHECKPOINTED, EXIT_USER_ERROR
from maxent_grpo.rundir.checkpoints import list_checkpoints, run_is_complete
from maxent_grpo.rundir.events import read_sparse
from maxent_grpo.rundir.heartbeat import read_exit_reports, read_heartbeats

EXIT_FAILED = 1
STOP_CLASSES = ("preempted", "time_limit", "stopped")
PERMANENT = ("user_error", "oom")
TRANSIENT = (*STOP_CLASSES, "hang", "crash", "node_failure", "reward_server_lost")
OOM_HINT = (
    "lower per_device_train_batch_size or num_generations (keeping the batch arithmetic), "
    "or set gradient_checkpointing: true"
)
# Lines that say a node of the job failed: srun's and slurmstepd's words for it.
_NODE_FAILURE = re.compile(r"node fail|NODE_FAIL|DUE TO NODE FAILURE", re.IGNORECASE)
# srun's line, the one that names the node: "srun: error: Node failure on node2".
_NODE_NAMED = re.compile(r"Node failure on \S")
# What a rank raises when a peer it exchanges tensors with is gone (gloo, NCCL, the c10d
# store): the peer is the cause, not this rank.
_PEER_LOST = re.compile(
    r"closed by peer|reset by peer|remote worker|remote process|Broken pipe", re.IGNORECASE
)
# srun's line for a task that ended: "srun: error: node2: task 1: Exited with exit code 1".
_SRUN_TASK_END = re.compile(r"srun: error: ([^\s:]+): tasks? [\d,-]+: ")
# An exception line in a log: "RuntimeError: ...", "[rank1]: torch.OutOfMemoryError: ...".
_EXCEPTION = re.compile(
    r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt)): (.+)$"
)
_OOM_LINE = re.compile(r"OutOfMemoryError|CUDA out of memory|MemoryError")
# What accelerate and torchrun raise about a failed child: the child's own error is earlier.
_LAUNCHERS = re.compile(r"ChildFailedError|CalledProcessError|SignalException")
# torchrun's summary of a failed child: "traceback : Signal 9 (SIGKILL) received by PID 2499".
_KILLED_RANK = re.compile(r"Signal (\d+) \((SIG\w+)\) received by PID (\d+)")
_FULL = re.compile(r"No space left on device|Disk quota exceeded|\[Errno (28|122)\]")


@dataclass(frozen=True)
class Outcome:
    kind: str  # a class above
    reason: str  # one line
    code: int  # the launcher's exit code
    requeued_by_slurm: bool = False  # Slurm already requeued the job (preemption, REQUEUE)
    silent_hosts: tuple[str, ...] = ()  # nodes that went away before Slurm said so

    @property
    def permanent(self) -> bool:
        return self.kind in PERMANENT

    @property
    def transient(self) -> bool:
        return self.kind in TRANSIENT


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def stop_outcome(
    reason: str, signal_name: str | None, job: Mapping[str, str] | None, restarts: int = 0
) -> Outcome:
    """A graceful stop's class. job: Slurm's record of this job (`scontrol show job -o`), or
    None outside Slurm (or when scontrol did not answer); restarts: this attempt's
    SLURM_RESTART_COUNT.

    What Slurm 22.05 shows (measured on the test cluster): during a preemption's grace time
    the job has a PreemptTime; when the grace time ends and the batch step gets SIGTERM, the
    job is already COMPLETING with Restarts one higher (Slurm requeues it itself) and no
    PreemptTime any more.
    """
    kind, by_slurm = "stopped", False
    if job is not None:
        state = job.get("JobState", "")
        by_slurm = int(job.get("Restarts") or 0) > restarts
        if job.get("PreemptTime", "None") not in ("None", "", "Unknown"):
            kind = "preempted"
        elif _job_node_failed(job):
            kind = "node_failure"  # Slurm ends the job on every node when one of them fails
        elif state == "TIMEOUT" or signal_name == "SIGUSR1":
            kind = "time_limit"
        elif state == "PREEMPTED" or by_slurm:
            kind = "preempted"
            reason = f"{reason}; Slurm requeued the job (preemption)" if by_slurm else reason
    return Outcome(kind, one_line(reason), EXIT_CHECKPOINTED, by_slurm)


def _job_node_failed(job: Mapping[str, str]) -> bool:
    return job.get("JobState") == "NODE_FAIL" or "NodeDown" in job.get("Reason", "")


def node_failed(tail: str, job: Mapping[str, str] | None) -> bool:
    """Whether a node of the job failed: srun's or Slurm's line at the end of the train log,
    or the job's record (`scontrol show job -o`, None outside Slurm)."""
    return _node_failure_line(tail) is not None or (job is not None and _job_node_failed(job))


def _normalised(reason: str) -> str:
    """A reason without the numbers that differ between two runs of the same error."""
    return re.sub(r"0x[0-9a-fA-F]+|\d+", "#", reason)


def crash_outcome(reason: str, previous: Mapping | None, kind: str = "crash") -> Outcome:
    """A crash (or another failure `kind`); permanent (user_error-like, no retry) when the
    previous attempt ended with the same class and error."""
    reason = one_line(reason)
    if previous and previous.get("outcome") == kind:
        before = one_line(previous.get("reason") or "").removeprefix("the same error twice: ")
        if _normalised(before) == _normalised(reason):
            return Outcome(kind, f"the same error twice: {reason}", EXIT_USER_ERROR)
    return Outcome(kind, reason, EXIT_FAILED)


def is_permanent(outcome: Outcome) -> bool:
    """Whether no later attempt may retry: permanent classes and a repeated crash."""
    return outcome.permanent or outcome.reason.startswith("the same error twice: ")


def _short(host) -> str:
    return str(host).split(".")[0]  # srun names nodes as Slurm does, hostnames may be FQDNs


def silent_hosts(reports: Sequence[Mapping], beats: Sequence[Mapping], tail: str) -> list[str]:
    """Hosts that went away: none of their ranks wrote an exit report and srun saw none of
    their tasks end (a killed process still ends its srun task; a failed node does not)."""
    ended = {_short(host) for host in _SRUN_TASK_END.findall(tail)}
    spoke = ended | {_short(r.get("host")) for r in reports}
    return sorted({_short(b["host"]) for b in beats if b.get("host")} - spoke)


def from_exit_reports(
    reports: Sequence[Mapping],
    previous: Mapping | None,
    beats: Sequence[Mapping] = (),
    tail: str = "",
) -> Outcome | None:
    """The class from the trainers' exit reports (rundir/heartbeat.py), the earliest first:
    the rank that failed first is the cause, the others often fail because of it. When that
    rank only lost a peer, and the hosts of some ranks went silent (beats: their heartbeats;
    tail: the end of the train log), those hosts failed: Slurm may take minutes to say so."""
    if not reports:
        return None
    first = min(reports, key=lambda r: r.get("time", 0))
    what = f"rank {first.get('rank')}: {first.get('type')}: {first.get('message', '')}"
    lost = silent_hosts(reports, beats, tail) if _PEER_LOST.search(what) else []
    if lost:
        why = f"{', '.join(lost)} went silent: no exit report from its ranks, no end from srun"
        reason = one_line(f"{why} ({what})")
        return Outcome("node_failure", reason, EXIT_FAILED, silent_hosts=tuple(lost))
    if first.get("kind") == "oom":
        return Outcome("oom", f"out of memory ({what}); {OOM_HINT}", EXIT_USER_ERROR)
    if first.get("kind") == "user_error":
        return Outcome("user_error", one_line(what), EXIT_USER_ERROR)
    return crash_outcome(what, previous)


def _node_failure_line(tail: str) -> str | None:
    """The last line of a log that says a node of the job failed (srun, Slurm), if any; srun's,
    which names the node, before slurmstepd's, which may come after it."""
    lines = [line.strip() for line in reversed(tail.splitlines())]
    for pattern in (_NODE_NAMED, _NODE_FAILURE):
        found = next((one_line(x) for x in lines if pattern.search(x)), None)
        if found is not None:
            return found
    return None


def from_log(tail: str, code: int | None, previous: Mapping | None) -> Outcome:
    """The class when no trainer wrote an exit report and no node failed: the end of the
    train log decides."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error: "):  # a user error, as the trainer prints it (entry.py)
            return Outcome("user_error", line.removeprefix("error: "), EXIT_USER_ERROR)
    for line in reversed(lines):
        if (match := _EXCEPTION.match(line)) and not _LAUNCHERS.search(match.group(1)):
            what = f"{match.group(1)}: {match.group(2)}"
            if _OOM_LINE.search(match.group(1)):
                return Outcome("oom", f"out of memory ({what}); {OOM_HINT}", EXIT_USER_ERROR)
            return crash_outcome(what, previous)
    killed = f"killed by signal {-code}" if code is not None and code < 0 else None
    return crash_outcome(f"training {killed or f'exited with code {code}'}", previous)


def previous_outcome(output_dir) -> dict | None:
    """The last outcome event of the run so far (before this attempt's start), or None."""
    outcomes = [e for e in read_sparse(output_dir, last_steps=0) if e["event"] == "outcome"]
    return outcomes[-1] if outcomes else None


def log_tail(path, lines: int = 60) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - 32768))
            data = handle.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def classify(output_dir, watched, stop, previous: Mapping | None, train_log) -> Outcome:
    """The attempt's class from what the launcher saw, most certain first: the completion
    marker, a hang, a dead reward-model or vLLM server (unless a signal stopped us), a stop
    (stop: stop_outcome's arguments, or None), the trainers' exit reports, the end of the
    train log.

    watched: launch/watch.py Watched.
    """
    if run_is_complete(output_dir):
        return Outcome("completed", "training complete", 0)
    if watched.hang is not None:
        return Outcome("hang", one_line(watched.hang.reason), EXIT_FAILED)
    # A stop without a signal of ours is the trainers' record of the SIGTERM the launcher sent
    # them because a server died (a signal's stop, e.g. preemption, wins).
    if stop is None or stop[1] is None:
        if watched.reward_server_died is not None:
            lost = watched.reward_server_died.splitlines()[0]
            return crash_outcome(lost, previous, "reward_server_lost")
        if watched.server_died is not None:
            return crash_outcome(watched.server_died.splitlines()[0], previous)
    tail = log_tail(train_log)
    node_failure = _node_failure_line(tail)  # srun or Slurm: a node of the job failed
    if stop is not None:
        if stop[1] is None and (killed := _rank_killed(tail)) is not None:
            # The trainers' record of a SIGTERM that torchrun sent the other ranks after one
            # was killed (found by bench/chaos.py: a node's ranks SIGKILLed read 'stopped').
            return crash_outcome(killed, previous)
        found = stop_outcome(*stop)
        if node_failure is not None:  # the stop was Slurm ending the job because of it
            return Outcome("node_failure", node_failure, found.code, found.requeued_by_slurm)
        return found
    if node_failure is not None:  # the ranks' errors follow from it
        return Outcome("node_failure", node_failure, EXIT_FAILED)
    reports, beats = read_exit_reports(output_dir), read_heartbeats(output_dir)
    found = from_exit_reports(reports, previous, beats, tail) or from_log(
        tail, watched.code, previous
    )
    return full_disk(found, output_dir)


def _rank_killed(tail: str) -> str | None:
    """torchrun's line for a rank killed by a signal other than its SIGTERM, if any."""
    for match in _KILLED_RANK.finditer(tail):
        if match.group(2) != "SIGTERM":
            return f"a training process was killed by {match.group(2)} (pid {match.group(3)})"
    return None


def full_disk(found: Outcome, output_dir, is_full=None) -> Outcome:
    """A crash on a full filesystem (or quota) says so in its one line, naming output_dir and
    the checkpoint the same command resumes from (found by bench/chaos.py: the line was
    'OSError: [Errno 28] No space left on device', no path). Also when the error does not say
    it (torch's checkpoint writer: 'unexpected pos 64 vs 0') but the filesystem is full now
    (`is_full(output_dir)`), and when the trainers' start-up check found output_dir not
    writable for lack of space: a full disk is no recipe error, the same command works once
    there is room (a user_error there was permanent)."""
    said = found.kind in ("crash", "user_error") and _FULL.search(found.reason)
    if not said and (found.kind != "crash" or not (is_full or filesystem_full)(output_dir)):
        return found
    reason = found.reason.removesuffix(_OTHER_DIRECTORY)
    if not said:
        reason += " (No space left on device: the filesystem is full after the crash)"
    complete = [c.path for c in list_checkpoints(output_dir) if c.complete]
    resume = f"it resumes from {complete[-1]}" if complete else "it starts again (no checkpoint)"
    reason = (
        f"{reason}: the filesystem of {output_dir} is full or over its quota; make room "
        f"and run the same command again: {resume}"
    )
    return dataclasses.replace(found, kind="crash", reason=reason, code=EXIT_FAILED)


# The output_dir check's advice (recipe/checks.py): wrong for a full disk, the directory is
# right and the same command works once there is room.
_OTHER_DIRECTORY = "; choose another directory"


def filesystem_full(path) -> bool:
    """Whether the filesystem holding `path` (or its nearest existing parent) has no block or
    no inode left for an unprivileged writer."""
    path = Path(path).absolute()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    try:
        stats = os.statvfs(existing) if existing is not None else None
    except OSError:
        return False
    return stats is not None and (stats.f_bavail == 0 or (stats.f_files and not stats.f_favail))
