"""Slurm decisions (pure, from the environment) and the two Slurm effects we need.

Requeue: `scontrol requeue` of this job, or of this array task (JOBID_TASKID). Array retries:
a user error found by one task is remembered in logs/ so later tasks exit at once with the
same message instead of burning their attempts.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    array_job_id: str | None
    array_task_id: str | None
    restart_count: int

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


def user_error_marker(logs_dir: Path, job: SlurmJob | None) -> Path | None:
    """Where an array job remembers a user error (None outside an array)."""
    if job is None or not job.array_job_id:
        return None
    return Path(logs_dir) / f".array_{job.array_job_id}_user_error"


def job_record(job: SlurmJob | None, timeout: float = 10.0) -> dict[str, str] | None:
    """Slurm's record of this job (`scontrol show job -o`: JobState, PreemptTime, ...), or None
    outside Slurm or when scontrol does not answer in `timeout` seconds."""
    if job is None:
        return None
    try:
        result = subprocess.run(
            ["scontrol", "show", "job", "-o", job.job_id],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line for line in result.stdout.splitlines() if "JobId=" in line]
    if result.returncode != 0 or not lines:
        return None
    record = {}
    for token in lines[0].split():
        key, sep, value = token.partition("=")
        if sep:
            record[key] = value
    return record
