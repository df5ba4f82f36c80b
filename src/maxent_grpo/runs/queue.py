"""The Slurm queue in `maxent-grpo runs`: this toolkit's pending and running jobs, from
`squeue`, shown before they have written anything, with Slurm's reason for a wait.

Jobs are found by their name. `maxent-grpo sbatch` names a job `maxent-grpo:<run>`;
`maxent-grpo sweep` names its array `maxent-grpo-sweep:<sweep>` and puts its points file in the
job's comment (each task is the point of its index); a plain `sbatch training.sh` keeps the
header's `maxent-grpo`, whose run is unknown until it writes (its row is `job <id>`).
Without squeue, or without a Slurm configuration, the queue is empty; a squeue that fails
otherwise (a controller that does not answer) is one note on stderr, and no error.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from maxent_grpo.errors import UserError
from maxent_grpo.rundir.sweeps import JOB_NAME, SWEEP_JOB_NAME, read_points
from maxent_grpo.runs.table import RunInfo

FIELDS = "%i|%j|%T|%r|%k"  # job id (array: 12_3), name, state, reason, comment
RUNNING = ("RUNNING", "CONFIGURING", "COMPLETING")
# What squeue says where no slurm.conf can be found (a machine that only has the client).
NOT_CONFIGURED = "Could not establish a configuration source"


@dataclass(frozen=True)
class QueuedJob:
    job_id: str  # "12", or "12_3" for task 3 of array 12
    name: str
    state: str  # squeue's: PENDING, RUNNING, ...
    reason: str  # why it waits: Priority, Resources, JobHeldUser, ...
    comment: str

    @property
    def array_job(self) -> str:
        return self.job_id.split("_", 1)[0]


def parse_queue(text: str) -> list[QueuedJob]:
    """squeue's lines (FIELDS), this toolkit's jobs only."""
    jobs = []
    for line in text.splitlines():
        parts = line.split("|", 4)
        if len(parts) != 5:
            continue
        job = QueuedJob(*(part.strip() for part in parts))
        if job.name == JOB_NAME or job.name.startswith((f"{JOB_NAME}:", f"{SWEEP_JOB_NAME}:")):
            jobs.append(job)
    return jobs


def read_queue(timeout: float = 10.0) -> tuple[list[QueuedJob], str | None]:
    """This user's toolkit jobs in the queue, and a note when squeue did not answer."""
    if shutil.which("squeue") is None:
        return [], None
    command = ["squeue", "--noheader", "--array", "--me", "--format", FIELDS]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return [], f"note: squeue did not answer ({exc}); queued jobs are not shown"
    if result.returncode != 0:
        if NOT_CONFIGURED in result.stderr:
            return [], None  # squeue installed, no Slurm set up here: as without squeue
        why = " ".join(result.stderr.split()[-12:]) or f"exit code {result.returncode}"
        return [], f"note: squeue failed ({why}); queued jobs are not shown"
    return parse_queue(result.stdout), None


def run_of(job: QueuedJob, sweeps: dict[str, list[str]]) -> str | None:
    """The run a queued job will write: from its name, or its sweep's points file (read once
    per file into `sweeps`); None when it does not say."""
    kind, _, rest = job.name.partition(":")
    if kind == JOB_NAME and rest:
        return rest
    _, _, task = job.job_id.partition("_")
    if kind != SWEEP_JOB_NAME or not task.isdigit() or not job.comment:
        return None
    if job.comment not in sweeps:
        try:
            sweeps[job.comment] = [point.name for point in read_points(job.comment)[1]]
        except UserError:
            sweeps[job.comment] = []
    names = sweeps[job.comment]
    return names[int(task)] if int(task) < len(names) else None


def merge_queue(runs: list[RunInfo], jobs: list[QueuedJob]) -> list[RunInfo]:
    """The runs with the queue's word on them: a pending job's run is `pending` with Slurm's
    reason (after what its files say of the last attempt); a queued job whose run wrote
    nothing yet gets a row of its own, before the others."""
    by_name = {run.run: run for run in runs}
    new: list[RunInfo] = []
    sweeps: dict[str, list[str]] = {}
    for job in jobs:
        name = run_of(job, sweeps) or f"job {job.job_id}"
        info = by_name.get(name)
        if info is None:
            info = by_name[name] = RunInfo(run=name, reason="nothing written yet")
            new.append(info)
        if job.array_job not in info.jobs:
            info.jobs.append(job.array_job)
        before = f"; last attempt: {info.state}" if info.attempts else ""
        if job.state == "PENDING":
            info.state, info.reason = "pending", f"queued ({job.reason}){before}"
        elif job.state not in RUNNING:  # suspended, held after a requeue, ...
            info.state, info.reason = job.state.lower(), f"Slurm: {job.reason}{before}"
        elif info.state in ("unknown", "pending"):
            info.state = "running"
    return [*new, *runs]
