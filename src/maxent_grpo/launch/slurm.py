"""Slurm decisions (pure, from the environment and Slurm's records) and the Slurm effects we
need (`scontrol requeue`, `show job`, `show config`).

Requeue: `scontrol requeue` of this job, or of this array task (JOBID_TASKID). Array retries:
a user error found by one task is remembered in logs/ so later tasks exit at once with the
same message instead of burning their attempts.

A node that went silent: a job requeued while one of its nodes is silent but not yet DOWN
stays COMPLETING until Slurm marks that node DOWN, and Slurm 22.05 then starts it again with
its GPU (gres) records broken: srun cannot create a step ("Invalid generic resource (gres)
specification"), and the GPUs of the job's healthy nodes stay counted as allocated after it
ends (`scontrol -d show node`: GresUsed), so the requeued job pends on "Resources" for good.
Measured on the test cluster (tests/slurm/test_multinode_runs.py). So after a node loss the
launcher leaves the requeue to Slurm: it waits for Slurm to mark the node DOWN, which requeues
the job itself (`--requeue`), and requeues it only if Slurm has not within its SlurmdTimeout.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Set by the launcher of a sweep's task (launch/sweep.py): its array index is a point of the
# sweep, a run of its own, not a retry of one run.
SWEEP_ENV = "MAXENT_GRPO_SWEEP_POINT"


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    array_job_id: str | None
    array_task_id: str | None
    restart_count: int
    sweep: bool = False  # the array's tasks are a sweep's points (SWEEP_ENV)

    @property
    def attempt(self) -> int:
        """The attempt number of its run (the array index of a retry array, else restarts)."""
        if self.array_task_id and not self.sweep:
            return int(self.array_task_id)
        return self.restart_count

    @property
    def requeue_target(self) -> str:
        """What `scontrol requeue` must name: the task of an array, else the job."""
        if self.array_job_id and self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id


def slurm_job(environ: Mapping[str, str]) -> SlurmJob | None:
    """This process's Slurm job, or None outside Slurm."""
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    return SlurmJob(
        job_id=job_id,
        array_job_id=environ.get("SLURM_ARRAY_JOB_ID") or None,
        array_task_id=environ.get("SLURM_ARRAY_TASK_ID") or None,
        restart_count=int(environ.get("SLURM_RESTART_COUNT") or 0),
        sweep=bool(environ.get(SWEEP_ENV)),
    )


def should_requeue(job: SlurmJob | None, max_requeues: int) -> tuple[bool, str]:
    """Whether a job that checkpointed on a stop request should requeue itself, and why not."""
    if job is None:
        return False, "not running under Slurm: run the same command again to resume"
    if job.restart_count >= max_requeues:
        return False, (
            f"requeued {job.restart_count} times already (max_requeues: {max_requeues}); "
            "resubmit to continue from the last checkpoint"
        )
    return True, ""


def requeue(job: SlurmJob) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["scontrol", "requeue", job.requeue_target], capture_output=True, text=True, timeout=60
    )


# SlurmdTimeout's default (man slurm.conf), for when `scontrol show config` does not answer.
DEFAULT_SLURMD_TIMEOUT_S = 300


def slurmd_timeout(timeout: float = 10.0) -> int:
    """SlurmdTimeout: how long a node may be silent before Slurm marks it DOWN (0: never)."""
    try:
        result = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.SubprocessError):
        return DEFAULT_SLURMD_TIMEOUT_S
    match = re.search(r"^SlurmdTimeout\s*=\s*(\d+)", result.stdout, re.MULTILINE)
    return int(match.group(1)) if match else DEFAULT_SLURMD_TIMEOUT_S


def node_down_wait_s(slurmd_timeout_s: int) -> float:
    """How long Slurm may take to mark a silent node DOWN: SlurmdTimeout, one round of its
    pings (every SlurmdTimeout/3) and 30 s for its messages; 0 when it never does."""
    return 0.0 if slurmd_timeout_s <= 0 else slurmd_timeout_s * 4 / 3 + 30


def slurm_verdict(record: Mapping[str, str] | None, restart_count: int) -> str | None:
    """What Slurm did with a running job (record: `job_record`): "requeued" (its Restarts went
    up), "ended the job (STATE)" (it is not running any more), or None (still running, or no
    answer)."""
    if record is None:
        return None
    if int(record.get("Restarts") or 0) > restart_count:
        return "requeued"
    state = record.get("JobState", "")
    return None if state in ("RUNNING", "") else f"ended the job ({state})"


def user_error_marker(logs_dir: Path, job: SlurmJob | None) -> Path | None:
    """Where an array job remembers a user error (None outside an array); a sweep's task
    remembers it for its own point only, so the other points still run."""
    if job is None or not job.array_job_id:
        return None
    task = f"_{job.array_task_id}" if job.sweep else ""
    return Path(logs_dir) / f".array_{job.array_job_id}{task}_user_error"


def job_record(job: SlurmJob | None, timeout: float = 10.0) -> dict[str, str] | None:
    """Slurm's record of this job (`scontrol show job -o`: JobState, PreemptTime, ...), or None
    outside Slurm or when scontrol does not answer in `timeout` seconds."""
    return None if job is None else _scontrol_record("job", job.job_id, "JobId=", timeout)


def _scontrol_record(kind: str, name: str, key: str, timeout: float) -> dict[str, str] | None:
    """`scontrol show KIND -o NAME`'s first line holding `key`, parsed; None when scontrol is
    missing, fails or does not answer in `timeout` s."""
    try:
        result = subprocess.run(
            ["scontrol", "show", kind, "-o", name],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line for line in result.stdout.splitlines() if key in line]
    if result.returncode != 0 or not lines:
        return None
    return parse_record(lines[0])


# Node states (`scontrol show node`) in which a step cannot start there: a restart would wait.
_UNUSABLE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "FUTURE")


def node_down(node: str, timeout: float = 10.0) -> str | None:
    """Slurm's state of `node` when no step can start there (DOWN, DRAIN, FAIL, not responding:
    `*`), else None, also when scontrol does not answer in `timeout` s (outside Slurm)."""
    record = _scontrol_record("node", node, "NodeName=", timeout)
    if record is None:
        return None
    state = record.get("State", "")
    unusable = state.endswith("*") or any(word in state for word in _UNUSABLE)
    return state if unusable else None


def parse_record(line: str) -> dict[str, str]:
    """One line of `scontrol show job -o` (or `show node -o`) as a dict: KEY=VALUE tokens, split
    at the first '=' (values may hold more); tokens without one are skipped."""
    record = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            record[key] = value
    return record
