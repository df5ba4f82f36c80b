"""Fixtures for tests that need a real Slurm cluster: one node, or several (marker multinode).

The cluster is managed by ``tests/slurm/cluster.sh``; see that script for details. Tests use the
session-scoped ``slurm_cluster`` fixture (one node, this host)::

    def test_something(slurm_cluster, tmp_path):
        job_id = slurm_cluster.submit(["-c", "1", "-o", str(tmp_path / "out"), "--wrap", "true"],
                                      cwd=tmp_path)
        assert slurm_cluster.wait(job_id, timeout=30) == "COMPLETED"

or ``multinode_cluster`` (3 nodes, each a network namespace with its own hostname and address;
tests marked ``multinode``, run by ``make test-multinode``). Only one layout runs at a time:
a fixture asking for the other node count restarts the cluster.

Skipping policy: the single-node tests are skipped only when ``MAXENT_GRPO_SLURM_TESTS`` is unset
(or ``0``) and ``sbatch`` is not installed. The multi-node tests run only with
``MAXENT_GRPO_MULTINODE_TESTS=1`` (they create network namespaces as root). When the variable
asks for the tests, a cluster that fails to start is a test error, never a skip.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from maxent_grpo.launch.slurm import parse_record

HERE = Path(__file__).resolve().parent
CLUSTER_SH = HERE / "cluster.sh"
ENABLE_VAR = "MAXENT_GRPO_SLURM_TESTS"
MULTINODE_VAR = "MAXENT_GRPO_MULTINODE_TESTS"
MULTINODE_NODES = 3
# Figures measured by the tests (cluster start, detection times), shown after the run.
TIMINGS: dict[str, float] = {}

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

# Reasons a job stays PENDING forever on the test cluster (e.g. more CPUs than a node has):
# waiting for those would only burn the timeout.
HOPELESS_REASONS = frozenset(
    {"PartitionConfig", "BadConstraints", "PartitionNodeLimit", "DependencyNeverSatisfied"}
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: needs a real Slurm cluster")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Multi-node tests stay out of `-m slurm`: the two suites need different clusters. The
    # fresh-clone test (a whole new environment, minutes of installs) has its own target.
    own_suites = ("multinode", "freshclone")
    for item in items:
        in_here = HERE in Path(item.path).resolve().parents
        if in_here and not any(item.get_closest_marker(m) for m in own_suites):
            item.add_marker(pytest.mark.slurm)


def pytest_terminal_summary(terminalreporter) -> None:
    if TIMINGS:
        terminalreporter.section("Slurm test cluster figures")
        for name, value in TIMINGS.items():
            terminalreporter.write_line(f"{name}: {value:.1f}")


@dataclass
class SlurmCluster:
    """Handle on the running test cluster."""

    env: dict[str, str]
    """Environment for sbatch/squeue/scontrol calls: ``os.environ`` plus ``SLURM_CONF``."""
    conf: Path
    state_dir: Path
    started_here: bool
    nodes: tuple[str, ...] = ()
    cluster_sh: Path = CLUSTER_SH
    timings: dict[str, float] = field(default_factory=dict)
    """Figures measured by the tests (shared by all tests; printed after the run)."""

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
        return [parse_record(line) for line in proc.stdout.splitlines() if "JobId=" in line]

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
            hopeless = [r for r in last if r.get("Reason") in HOPELESS_REASONS]
            if hopeless:
                raise RuntimeError(f"job {job_id} can never start: {hopeless[0]}")
            if not states:
                # Just submitted ids are always known; give a short grace period, then fail.
                unknown_since = unknown_since or time.monotonic()
                if time.monotonic() - unknown_since > 5:
                    raise RuntimeError(f"job {job_id} is unknown to slurmctld")
            if time.monotonic() >= deadline:
                # The nodes too: a job pending on "Resources" beside idle nodes is Slurm's
                # bookkeeping (GresUsed), not the job.
                nodes = self.run(["scontrol", "-d", "show", "node", "-o"]).stdout
                raise TimeoutError(
                    f"job {job_id} not finished after {timeout} s; last state: {states}; "
                    f"records: {last}; nodes: {nodes}"
                )
            time.sleep(poll)

    def cancel(self, job_id: str) -> None:
        self.run(["scancel", str(job_id)])

    def cancel_all(self, timeout: float = 120) -> list[str]:
        """Cancel every job the controller still has and wait (at most `timeout` s) until
        none is left; returns the ids that were left."""
        listed = self.run(["squeue", "-h", "-o", "%A"]).stdout.split()
        if listed:
            self.run(["scancel", "--full", *listed])
        deadline = time.monotonic() + timeout
        while self.run(["squeue", "-h", "-o", "%A"]).stdout.split():
            if time.monotonic() > deadline:
                break
            time.sleep(1)
        return listed

    def cluster(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """Run ``cluster.sh *args`` (start [--nodes N]|stop|status|env|kill-node N|node-pids N)."""
        return _cluster_sh(*args, timeout=timeout)

    def node_state(self, node: str) -> str:
        """Slurm's state of one node (``idle``, ``down*``, ...)."""
        proc = self.run(["sinfo", "-h", "-N", "-n", node, "-p", "debug", "-o", "%T"])
        return proc.stdout.strip()

    def node_record(self, node: str) -> dict[str, str]:
        """``scontrol -d show node -o NODE`` as a dict (NodeAddr, CPUTot, State, GresUsed, ...)."""
        (record,) = (
            parse_record(line)
            for line in self.run(["scontrol", "-d", "show", "node", "-o", node]).stdout.splitlines()
        )
        return record

    def node_addr(self, node: str) -> str:
        return self.node_record(node)["NodeAddr"]

    def node_cpus(self, node: str) -> int:
        """The CPUs Slurm schedules on a node (the advertised count, not the machine's)."""
        return int(self.node_record(node)["CPUTot"])

    def job_nodes(self, job_id: str) -> list[str]:
        """The job's nodes in Slurm's order (empty while it has none)."""
        (record,) = self.job_records(job_id)
        nodelist = record.get("NodeList", "(null)")
        if nodelist in ("", "(null)"):
            return []
        return self.run(["scontrol", "show", "hostnames", nodelist]).stdout.split()


def _cluster_sh(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), *args],
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


def _running_nodes() -> int | None:
    """Node count of the healthy cluster running now, or None."""
    if _cluster_sh("status", timeout=60).returncode != 0:
        return None
    return int(_cluster_env().get("SLURM_TEST_NODES", "1"))


@contextmanager
def _cluster(nodes: int) -> Iterator[SlurmCluster]:
    """Start (or reuse) a cluster of ``nodes`` nodes; stop it afterwards if started here."""
    running = _running_nodes()
    t0 = time.monotonic()
    started = _cluster_sh("start", "--nodes", str(nodes))
    start_s = time.monotonic() - t0
    if started.returncode != 0:
        # Deliberately an error, not a skip: the environment asked for Slurm tests.
        raise RuntimeError(
            f"tests/slurm/cluster.sh start --nodes {nodes} failed ({started.returncode}):\n"
            f"{started.stdout[-4000:]}\n{started.stderr[-4000:]}"
        )
    TIMINGS[f"cluster start, {nodes} node(s) (s)"] = start_s

    exported = _cluster_env()
    env = dict(os.environ)
    env.update(exported)
    conf = Path(exported["SLURM_CONF"])
    names = subprocess.run(
        ["sinfo", "-h", "-N", "-p", "debug", "-o", "%N"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    cluster = SlurmCluster(
        env=env,
        conf=conf,
        state_dir=Path(exported.get("SLURM_TEST_DIR", conf.parent.parent)),
        started_here=running != nodes,
        nodes=tuple(names),
        timings=TIMINGS,
    )
    try:
        yield cluster
    finally:
        if cluster.started_here:
            stopped = _cluster_sh("stop", timeout=180)
            if stopped.returncode != 0:
                raise RuntimeError(f"cluster.sh stop failed:\n{stopped.stderr[-4000:]}")


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test(request) -> Iterator[None]:
    """A test that ends with its jobs still queued or running would hold the nodes for every
    later test (a CI run of 6987b79: one chain job that did not finish in 600 s left 11 more
    tests' jobs pending on Priority): what a test leaves is cancelled after it."""
    names = [n for n in ("slurm_cluster", "multinode_cluster") if n in request.fixturenames]
    clusters = [request.getfixturevalue(n) for n in names]
    yield
    for cluster in clusters:
        if left := cluster.cancel_all():
            print(f"\ncancelled the jobs {request.node.name} left: {' '.join(left)}")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    flag = os.environ.get(ENABLE_VAR, "")
    if flag == "0":
        pytest.skip(f"Slurm tests disabled by {ENABLE_VAR}=0")
    if not flag and shutil.which("sbatch") is None:
        pytest.skip(f"sbatch not installed (set {ENABLE_VAR}=1 to install and run a test cluster)")
    with _cluster(1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def multinode_cluster() -> Iterator[SlurmCluster]:
    if os.environ.get(MULTINODE_VAR, "") != "1":
        pytest.skip(f"multi-node Slurm tests need {MULTINODE_VAR}=1 and root (make test-multinode)")
    with _cluster(MULTINODE_NODES) as cluster:
        assert len(cluster.nodes) == MULTINODE_NODES, cluster.nodes
        yield cluster
