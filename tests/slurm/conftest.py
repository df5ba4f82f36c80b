"""Fixtures for tests that need a real (single-node) Slurm cluster.

The cluster is managed by ``tests/slurm/cluster.sh``; see that script for details. Tests use the
session-scoped ``slurm_cluster`` fixture::

    def test_something(slurm_cluster, tmp_path):
        job_id = slurm_cluster.submit(["-c", "1", "-o", str(tmp_path / "out"), "--wrap", "true"],
                                      cwd=tmp_path)
        assert slurm_cluster.wait(job_id, timeout=30) == "COMPLETED"

Skipping policy: the tests are skipped only when ``MAXENT_GRPO_SLURM_TESTS`` is unset (or ``0``)
and ``sbatch`` is not installed. With ``MAXENT_GRPO_SLURM_TESTS=1`` (CI) a cluster that fails to
start is a test error, never a skip.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CLUSTER_SH = HERE / "cluster.sh"
ENABLE_VAR = "MAXENT_GRPO_SLURM_TESTS"

# Job states after which a job will not change again on its own.
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
        # Held states: nothing happens without an operator, so report them instead of hanging.
        "REQUEUE_HOLD",
        "SPECIAL_EXIT",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: needs a real Slurm cluster")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.slurm)


def _parse_job_record(line: str) -> dict[str, str]:
    """Parse one ``scontrol show job -o`` line into a dict (values may contain '=')."""
    record: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            record[key] = value
    return record


@dataclass
class SlurmCluster:
    """Handle on the running test cluster."""

    env: dict[str, str]
    """Environment for sbatch/squeue/scontrol calls: ``os.environ`` plus ``SLURM_CONF``."""
    conf: Path
    state_dir: Path
    started_here: bool
    cluster_sh: Path = CLUSTER_SH
    timings: dict[str, float] = field(default_factory=dict)

    def run(
        self, args: Sequence[str], *, cwd: str | os.PathLike[str] | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (e.g. ``["squeue", "-h"]``) against the test cluster."""
        return subprocess.run(
            list(args),
            cwd=cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def submit(self, args: Sequence[str], cwd: str | os.PathLike[str]) -> str:
        """``sbatch --parsable *args`` in ``cwd``; returns the job id (e.g. ``"12"``)."""
        proc = self.run(["sbatch", "--parsable", *args], cwd=cwd)
        if proc.returncode != 0:
            raise RuntimeError(
                f"sbatch {shlex.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}"
            )
        # --parsable prints "jobid" or "jobid;cluster".
        return proc.stdout.strip().splitlines()[-1].split(";")[0]

    def job_records(self, job_id: str) -> list[dict[str, str]]:
        """``scontrol show job -o`` as dicts: one per job, or one per task of an array job.

        Returns ``[]`` when the controller does not know the id (never submitted or purged).
        """
        proc = self.run(["scontrol", "show", "job", "-o", str(job_id)])
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:
                return []
            raise RuntimeError(f"scontrol show job {job_id} failed: {proc.stderr.strip()}")
        return [_parse_job_record(line) for line in proc.stdout.splitlines() if "JobId=" in line]

    def state(self, job_id: str) -> str | None:
        """Current state of a job (array: the tasks' states joined by ',' when they differ)."""
        records = self.job_records(job_id)
        if not records:
            # Fall back to squeue, which knows every job the controller still tracks.
            proc = self.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"])
            states = sorted(set(proc.stdout.split())) if proc.returncode == 0 else []
            return ",".join(states) or None
        states = sorted({r.get("JobState", "UNKNOWN") for r in records})
        return ",".join(states)

    def wait(self, job_id: str, timeout: float = 60, poll: float = 0.5) -> str:
        """Wait until the job (all tasks, for an array id like ``12``; one task for ``12_3``)
        reaches a terminal state and return it.

        For an array whose tasks finished differently, returns the first non-COMPLETED task
        state. Raises ``TimeoutError`` (with the last ``scontrol`` record) when time runs out.
        """
        deadline = time.monotonic() + timeout
        last: list[dict[str, str]] = []
        unknown_since: float | None = None
        while True:
            last = self.job_records(job_id)
            states = [r.get("JobState", "UNKNOWN") for r in last]
            if states and all(s in TERMINAL_STATES for s in states):
                failed = [s for s in states if s != "COMPLETED"]
                return failed[0] if failed else "COMPLETED"
            if not states:
                # Just submitted ids are always known; give a short grace period, then fail.
                unknown_since = unknown_since or time.monotonic()
                if time.monotonic() - unknown_since > 5:
                    raise RuntimeError(f"job {job_id} is unknown to slurmctld")
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"job {job_id} not finished after {timeout} s; last state: {states}; "
                    f"records: {last}"
                )
            time.sleep(poll)

    def cancel(self, job_id: str) -> None:
        self.run(["scancel", str(job_id)])

    def cluster(self, command: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """Run ``cluster.sh <command>`` (start|stop|status|env)."""
        return _cluster_sh(command, timeout=timeout)


def _cluster_sh(command: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _cluster_env() -> dict[str, str]:
    proc = _cluster_sh("env", timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"cluster.sh env failed: {proc.stderr}")
    exported: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        parts = shlex.split(line)
        if len(parts) == 2 and parts[0] == "export" and "=" in parts[1]:
            key, _, value = parts[1].partition("=")
            exported[key] = value
    return exported


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    flag = os.environ.get(ENABLE_VAR, "")
    if flag == "0":
        pytest.skip(f"Slurm tests disabled by {ENABLE_VAR}=0")
    if not flag and shutil.which("sbatch") is None:
        pytest.skip(f"sbatch not installed (set {ENABLE_VAR}=1 to install and run a test cluster)")

    healthy_before = _cluster_sh("status", timeout=60).returncode == 0
    t0 = time.monotonic()
    started = _cluster_sh("start")
    start_s = time.monotonic() - t0
    if started.returncode != 0:
        # Deliberately an error, not a skip: the environment asked for Slurm tests.
        raise RuntimeError(
            f"tests/slurm/cluster.sh start failed ({started.returncode}):\n"
            f"{started.stdout[-4000:]}\n{started.stderr[-4000:]}"
        )

    exported = _cluster_env()
    env = dict(os.environ)
    env.update(exported)
    cluster = SlurmCluster(
        env=env,
        conf=Path(exported["SLURM_CONF"]),
        state_dir=Path(exported.get("SLURM_TEST_DIR", Path(exported["SLURM_CONF"]).parent.parent)),
        started_here=not healthy_before,
        timings={"start_s": start_s},
    )
    try:
        yield cluster
    finally:
        if cluster.started_here:
            stopped = _cluster_sh("stop", timeout=180)
            if stopped.returncode != 0:
                raise RuntimeError(f"cluster.sh stop failed:\n{stopped.stderr[-4000:]}")
