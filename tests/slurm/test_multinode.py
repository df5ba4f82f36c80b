"""Prove that the multi-node test cluster (tests/slurm/cluster.sh start --nodes 3) is a real
cluster: distinct hosts with their own names and addresses, TCP between the tasks of a job,
requeue of a multi-node job, a crashed node noticed by Slurm within a bound; then CPU training
(gloo) across two nodes, by hand and through training.sh / slurm/multinode.sbatch, ending with
the same weights as on one node."""

from __future__ import annotations

import stat
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers.paths import REPO
from helpers.procs import wait_for
from helpers.recipes import ONE_THREAD, small_recipe

pytestmark = pytest.mark.multinode

PYTHON = sys.executable


def _script(path: Path, body: str, shebang: str = "#!/bin/bash") -> Path:
    path.write_text(f"{shebang}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def processes_on(cluster, node: str) -> list[str]:
    """Command lines of every process running on a node (its network namespace)."""
    proc = cluster.cluster("node-pids", node, timeout=30)
    assert proc.returncode == 0, proc.stderr
    lines = []
    for pid in proc.stdout.split():
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue  # exited meanwhile
    return lines


def test_nodes_are_distinct_hosts(multinode_cluster):
    cluster = multinode_cluster
    proc = cluster.run(
        [
            "srun",
            f"--nodes={len(cluster.nodes)}",
            f"--ntasks={len(cluster.nodes)}",
            "--ntasks-per-node=1",
            "bash",
            "-c",
            'echo "$SLURMD_NODENAME $(hostname) $(hostname -i)"',
        ],
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert sorted(row[1] for row in rows) == sorted(cluster.nodes), rows
    for slurm_name, hostname, address in rows:
        assert slurm_name == hostname
        # The name resolves, on the node itself, to the address Slurm talks to.
        assert address == cluster.node_addr(hostname)
    assert len({row[2] for row in rows}) == len(cluster.nodes), rows


TCP_PAIR = """
import os, socket, subprocess, time

rank = int(os.environ["SLURM_PROCID"])
nodes = subprocess.run(
    ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
    capture_output=True, text=True, check=True, timeout=30,
).stdout.split()
me, port = socket.gethostname(), 47123
if rank == 0:
    server = socket.create_server((socket.gethostbyname(me), port))
    server.settimeout(60)
    conn, peer = server.accept()
    conn.settimeout(30)
    message = conn.recv(200).decode()
    conn.sendall(f"ack from {me}".encode())
    print(f"server {me} got [{message}] from {peer[0]}", flush=True)
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection((nodes[0], port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.settimeout(30)
    conn.sendall(f"hello from {me}".encode())
    print(f"client {me} got [{conn.recv(200).decode()}]", flush=True)
"""


def test_tasks_of_a_two_node_job_talk_over_tcp(multinode_cluster, tmp_path):
    cluster = multinode_cluster
    pair = tmp_path / "pair.py"
    pair.write_text(TCP_PAIR)
    out = tmp_path / "tcp.out"
    # The batch script runs on the first node; its srun starts one task per node.
    script = _script(
        tmp_path / "tcp.sh",
        f"srun --nodes=2 --ntasks=2 --ntasks-per-node=1 {PYTHON} {pair}\n",
    )
    job = cluster.submit(
        ["--nodes=2", "--ntasks-per-node=1", "-o", str(out), str(script)], tmp_path
    )
    assert cluster.wait(job, timeout=90) == "COMPLETED", out.read_text(errors="replace")
    first, second = cluster.job_nodes(job)
    lines = sorted(out.read_text(errors="replace").splitlines())
    assert lines == [
        f"client {second} got [ack from {first}]",
        f"server {first} got [hello from {second}] from {cluster.node_addr(second)}",
    ], lines


REQUEUE = """
echo "attempt ${SLURM_RESTART_COUNT:-0} on $(srun --ntasks=2 hostname | sort | tr '\\n' ' ')"
if [[ -z "${SLURM_RESTART_COUNT:-}" ]]; then
    # A step on both nodes that only the requeue can end.
    srun --ntasks=2 sleep 300 &
    sleep 2
    scontrol requeue "$SLURM_JOB_ID"
    sleep 120
    exit 1
fi
echo "done"
"""


def test_a_two_node_job_requeues_itself(multinode_cluster, tmp_path):
    cluster = multinode_cluster
    out = tmp_path / "requeue.out"
    script = _script(tmp_path / "requeue.sh", REQUEUE)
    job = cluster.submit(
        ["--nodes=2", "--ntasks-per-node=1", "--requeue", "--open-mode=append", "-o", str(out)]
        + [str(script)],
        tmp_path,
    )
    assert cluster.wait(job, timeout=120) == "COMPLETED", out.read_text(errors="replace")
    lines = out.read_text(errors="replace").splitlines()
    attempts = [line.split() for line in lines if line.startswith("attempt")]
    assert [a[1] for a in attempts] == ["0", "1"], lines
    for attempt in attempts:
        hosts = attempt[3:]
        assert len(hosts) == 2 and len(set(hosts)) == 2 and set(hosts) <= set(cluster.nodes)
    assert lines[-1] == "done", lines
    (record,) = cluster.job_records(job)
    assert record["Restarts"] == "1", record
    # The first attempt's step was killed on every node, not only on the batch node.
    for node in cluster.nodes:
        left = [cmd for cmd in processes_on(cluster, node) if cmd.startswith("sleep 300")]
        assert not left, (node, left)


HOLD = """
srun --ntasks=2 bash -c 'echo "$(hostname)" >> {marker}; exec sleep 600'
"""


def test_a_crashed_node_is_marked_down_and_its_job_requeued(multinode_cluster, tmp_path):
    cluster = multinode_cluster
    marker = tmp_path / "running"
    script = _script(tmp_path / "hold.sh", HOLD.format(marker=marker))
    job = cluster.submit(
        ["--nodes=2", "--ntasks-per-node=1", "--requeue", "-o", str(tmp_path / "hold.out")]
        + [str(script)],
        tmp_path,
    )
    try:
        wait_for(lambda: _hosts(marker) and len(_hosts(marker)) == 2, 60, "the first attempt")
        # Not the batch node: the failure of any node of a job must end and requeue it.
        victim = cluster.job_nodes(job)[1]
        t0 = time.monotonic()
        crashed = cluster.cluster("kill-node", victim, timeout=60)
        assert crashed.returncode == 0, crashed.stderr
        watch = _watch_failure(cluster, job, victim, t0)
        seen = wait_for(watch, 120, f"{victim}'s failure", poll=0.25)  # times the detection
        cluster.timings["crashed node marked down after (s)"] = seen["down"]
        cluster.timings["its job stopped running after (s)"] = seen["job"]
        # Node failure requeues the job (JobRequeue=1): it runs again on two live nodes.
        wait_for(lambda: len(_hosts(marker)) == 4, 60, "the requeued job to run again")
        (record,) = cluster.job_records(job)
        assert record["JobState"] == "RUNNING" and record["Restarts"] == "1", record
        again = _hosts(marker)[2:]
        assert victim not in again and sorted(again) == sorted(cluster.job_nodes(job)), again
    finally:
        cluster.cancel(job)
        restarted = cluster.cluster("start", "--nodes", str(len(cluster.nodes)), timeout=300)
    assert restarted.returncode == 0, restarted.stderr
    assert cluster.node_state(victim) == "idle"


def _hosts(marker: Path) -> list[str]:
    """The hosts that ran the HOLD step so far, in order."""
    return marker.read_text(errors="replace").split() if marker.exists() else []


def _watch_failure(cluster, job: str, victim: str, t0: float):
    """A poll function: the seconds after t0 at which `victim` was marked down and `job`
    stopped running, once both happened (None before)."""
    times: dict[str, float] = {}

    def poll() -> dict[str, float] | None:
        if "down" not in times and "down" in cluster.node_state(victim):
            times["down"] = time.monotonic() - t0
        (record,) = cluster.job_records(job)
        if "job" not in times and (record["JobState"] != "RUNNING" or record["Restarts"] != "0"):
            times["job"] = time.monotonic() - t0
        return times if len(times) == 2 else None

    return poll


# One accelerate launcher per node (srun: one task per node), 2 training processes in all:
# 2 on one machine with --nodes=1, 1 per machine with --nodes=2 (gloo across the namespaces).
TRAIN = """
export OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES= HF_HUB_OFFLINE=1 WANDB_MODE=disabled
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
echo "training on $SLURM_JOB_NODELIST, main process on $first"
srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c \\
    "echo machine \\$SLURM_PROCID on \\$(hostname)
    exec {python} -m accelerate.commands.launch --multi_gpu --num_processes 2 \\
    --num_machines $SLURM_NNODES --machine_rank \\$SLURM_PROCID --main_process_ip $first \\
    --main_process_port 29533 --mixed_precision no --dynamo_backend no {entry} --config {recipe}"
"""


def _train(cluster, folder: Path, nodes: int, tiny_model: Path) -> tuple[Path, float]:
    """sbatch the smoke recipe on `nodes` nodes; returns the output dir and the job's time."""
    recipe = _recipe(folder, tiny_model)
    script = _script(
        folder / "train.sh",
        TRAIN.format(python=sys.executable, entry=REPO / "src" / "grpo.py", recipe=recipe),
    )
    out = folder / "slurm.out"
    t0 = time.monotonic()
    job = cluster.submit(
        [f"--nodes={nodes}", "--ntasks-per-node=1", "-o", str(out), str(script)], REPO
    )
    state = cluster.wait(job, timeout=400)
    assert state == "COMPLETED", out.read_text(errors="replace")[-4000:]
    machines = sorted(
        line for line in out.read_text(errors="replace").splitlines() if line.startswith("machine")
    )
    assert machines == [
        f"machine {rank} on {node}" for rank, node in enumerate(cluster.job_nodes(job))
    ]
    return folder / "out", time.monotonic() - t0


def _recipe(folder: Path, tiny_model: Path) -> Path:
    """Small, 8 steps, one thread per trainer (the runs are compared to 1e-6), with a reward
    the random tiny model gets partly right: non-zero advantages, so the weights move (the
    smoke rewards are all 0 for it, and equal weights would prove nothing)."""
    reward = dict(reward_funcs=["digit_fraction"], reward_weights=None)
    return small_recipe(
        folder, tiny_model, **ONE_THREAD, **reward, max_steps=8, max_completion_length=16
    )


@pytest.fixture(scope="module")
def one_node_run(multinode_cluster, tmp_path_factory, tiny_model) -> Path:
    """The reference: 2 training processes on one node (the recipe every run here uses)."""
    out, seconds = _train(multinode_cluster, tmp_path_factory.mktemp("one_node"), 1, tiny_model)
    multinode_cluster.timings["1-node training job, 8 steps (s)"] = seconds
    return out


def _max_diff(a: Path, b: Path) -> float:
    wa, wb = (load_file(str(p / "model.safetensors")) for p in (a, b))
    assert wa.keys() == wb.keys()
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


def _assert_same_training(out: Path, reference: Path, tiny_model: Path) -> float:
    """The run in `out` ended with the reference's weights (to 1e-6), and they moved."""
    diff = _max_diff(out, reference)
    assert diff <= 1e-6, diff
    # The weights moved: a run that trained nothing would also match.
    trained, initial = (load_file(str(p / "model.safetensors")) for p in (out, tiny_model))
    assert max((trained[k] - initial[k]).abs().max().item() for k in initial) > 1e-4
    return diff


def test_gloo_training_across_two_nodes_matches_one_node(
    multinode_cluster, tmp_path, tiny_model, one_node_run
):
    cluster = multinode_cluster
    two, seconds = _train(cluster, tmp_path / "two_nodes", 2, tiny_model)
    cluster.timings["2-node training job, 8 steps (s)"] = seconds
    diff = _assert_same_training(two, one_node_run, tiny_model)
    cluster.timings["max |weight difference|, 2 nodes vs 1 node"] = diff


# What users submit; both ask for 32 CPUs and 8 GPUs per node, as written.
@pytest.mark.parametrize(
    "script, sbatch_args",
    [("training.sh", ["--nodes=2"]), ("slurm/multinode.sbatch", [])],  # its header: 2 nodes
)
def test_sbatch_script_trains_across_two_nodes(
    multinode_cluster, tmp_path, tiny_model, one_node_run, script, sbatch_args
):
    """The launcher, on the first node, starts one accelerate per node through srun."""
    cluster = multinode_cluster
    recipe = _recipe(tmp_path, tiny_model)
    logs = [f"--output={tmp_path}/slurm_%j.out", f"--error={tmp_path}/slurm_%j.err"]
    job = cluster.submit(
        [
            *sbatch_args,
            *logs,
            script,
            "--config",
            str(recipe),
            "--logs-dir",
            str(tmp_path / "logs"),
        ],
        REPO,
    )
    state = cluster.wait(job, timeout=300)
    # Two nodes write into one file through srun: a multi-byte character may be cut.
    out = (tmp_path / f"slurm_{job}.out").read_text(errors="replace")
    assert state == "COMPLETED", (
        out[-4000:] + (tmp_path / f"slurm_{job}.err").read_text(errors="replace")[-2000:]
    )
    nodes = cluster.job_nodes(job)
    assert len(nodes) == 2, nodes
    assert f"training: 2 processes on 2 machine(s) {','.join(nodes)}," in out, out[-4000:]
    _assert_same_training(tmp_path / "out", one_node_run, tiny_model)
