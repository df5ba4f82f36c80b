"""Our own entry points on the 3-node test cluster: a vLLM CPU server on one node with training
on the two others, and the time-limit signal of a 2-node training job (checkpoint, requeue,
resume). Needs vLLM's CPU build in this venv (`make test-multinode` installs it)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from test_multinode import _recipe, processes_on
from test_training_slurm import (
    FRESH,
    RESUME_STEPS,
    elapsed_s,
    sbatch_training,
    slurm_out,
    train_logs,
    wait_for,
)

from helpers.paths import MAXENT_GRPO, REPO, SMOKE_VLLM
from helpers.recipes import TWO_TRAINERS
from helpers.resume import saved_ahead

pytestmark = pytest.mark.multinode

SLOW = "tests.helpers.slow_rewards:slow_digit_fraction"  # 0.2 s a step: a preemption lands mid-run


def _small(folder: Path, tiny_model: Path, base: Path | None = None, **keys) -> Path:
    """test_multinode's small recipe, or `base` with its model, output, data size and threads;
    then `keys`."""
    path = _recipe(folder, tiny_model)
    data = yaml.safe_load(path.read_text())
    if base is not None:
        kept = ("model_name_or_path", "output_dir", "dataset_num_rows", "env")
        data = {**yaml.safe_load(base.read_text()), **{key: data[key] for key in kept}}
    path.write_text(yaml.safe_dump({**data, **keys}))
    return path


def _events(out: Path) -> list[dict]:
    lines = (out / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _ours_left(cluster, *markers: str) -> dict[str, list[str]]:
    """Processes whose command line holds one of `markers`, still running, per node."""
    left = {
        node: [cmd for cmd in processes_on(cluster, node) if any(m in cmd for m in markers)]
        for node in cluster.nodes
    }
    return {node: cmds for node, cmds in left.items() if cmds}


def test_three_nodes_vllm_server_on_the_first_trains_on_the_others(
    multinode_cluster, tmp_path, tiny_model
):
    cluster = multinode_cluster
    # Async generation across nodes (docs/async.md): the main process, on node 2, gathers both
    # trainers' next prompts and sends them ahead; the checkpoint at step 2 waits for them.
    recipe = _small(
        tmp_path,
        tiny_model,
        SMOKE_VLLM,
        max_steps=4,
        save_steps=2,
        async_generation=True,
        **TWO_TRAINERS,  # one on each training node
    )
    t0 = time.monotonic()
    job = sbatch_training(cluster, tmp_path, recipe, "--nodes=3")
    state = cluster.wait(job, timeout=600)
    cluster.timings["3 nodes, vLLM CPU server + 2 trainers, 4 steps: job time (s)"] = (
        time.monotonic() - t0
    )
    out = slurm_out(tmp_path)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted((tmp_path / "logs").glob("*")))
    assert state == "COMPLETED", out[-4000:] + logs[-4000:]

    first, *training = cluster.job_nodes(job)
    assert f"vllm server: node {first}, CPU" in out, out[-3000:]
    assert f"training: 2 processes on 2 machine(s) {','.join(training)}," in out, out[-3000:]
    assert re.search(r"vLLM server healthy after [\d.]+s", out)
    history = yaml.safe_load((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    steps = {e["step"]: e for e in history if "loss" in e}
    assert sorted(steps) == [1, 2, 3, 4]
    # Every step pushed its weights to node 0's server (disk sync) before the next request.
    assert all(steps[s]["vllm/weight_sync_seconds"] > 0 for s in steps)
    # Steps 2-4 trained on completions generated during the step before, from the weights one
    # step older (the first step has none waiting).
    made_ahead = [steps[s]["async/prefetched"] for s in steps]
    staleness = [steps[s].get("async/staleness_max") for s in steps]
    assert made_ahead == [0.0, 1.0, 1.0, 1.0] and staleness == [None, 1.0, 1.0, 1.0], steps
    # The checkpoint at step 2 waited for step 3's request, in flight: the main process (node
    # 2) saved its 8 completions with their policy version (1), node 3's rank its prompts.
    import torch  # here: the other multinode tests need not pay for it

    saved = [
        torch.load(tmp_path / "out" / "checkpoint-2" / f"registered_state-{rank}.pt")
        for rank in (0, 1)
    ]
    ahead = [saved_ahead(state["pieces"]["async_generation"]) for state in saved]
    assert [[(a[0], a[1]) for a in rank] for rank in ahead] == [[(3, 1)], [(3, 1)]], ahead
    assert len(ahead[0][0][2]) == 8 and ahead[1][0][2] is None, ahead
    assert (tmp_path / "out" / "maxent_grpo_training_complete.json").is_file()
    # Nothing of the run is left on any node: no launcher, trainer or server (vLLM's engine
    # process is titled VLLM::EngineCore).
    left = _ours_left(cluster, str(recipe), "vllm", "VLLM")
    assert not left, left


def test_time_limit_signal_on_two_nodes_checkpoints_every_rank_and_resumes(
    multinode_cluster, tmp_path, tiny_model
):
    cluster = multinode_cluster
    # As on one node (test_training_slurm): steps of 1 s or more in the first attempt only, so
    # 100 steps outlast the signal's wait whatever the load and the resumed one runs at once.
    steps = RESUME_STEPS
    recipe = _small(tmp_path, tiny_model, max_steps=steps, **FRESH)
    job = sbatch_training(
        cluster,
        tmp_path,
        recipe,
        *("--nodes=2", "--time=10", "--signal=B:USR1@100", "--requeue"),
        "--export=ALL,FRESH_START_REWARD_S=1",
    )
    # Shorten the limit once training runs, so that the signal comes mid-training, then give
    # the second attempt room to finish.
    wait_for(
        lambda: "'loss'" in "".join(p.read_text(errors="replace") for p in train_logs(tmp_path)),
        240,
        "training",
    )
    (record,) = cluster.job_records(job)
    update = cluster.run(
        ["scontrol", "update", f"JobId={job}", f"TimeLimit={elapsed_s(record) // 60 + 2}"]
    )
    assert update.returncode == 0, update.stderr
    wait_for(lambda: "requeueing " in slurm_out(tmp_path), 150, "the first attempt to requeue")
    cluster.run(["scontrol", "update", f"JobId={job}", "TimeLimit=15"])
    assert cluster.wait(job, timeout=600) == "COMPLETED", slurm_out(tmp_path)[-4000:]

    logs = train_logs(tmp_path)
    assert len(logs) == 2, logs
    first, second = (p.read_text(errors="replace") for p in logs)
    stopped = re.search(r"Stopped on request after step (\d+); saved (\S+)", first)
    assert stopped, first[-3000:]
    step, checkpoint = int(stopped.group(1)), Path(stopped.group(2))
    assert 0 < step < steps and checkpoint.name == f"checkpoint-{step}"
    # Both ranks, one per node, wrote their part of that checkpoint (their RNG states).
    assert (checkpoint / "rng_state_0.pth").is_file() and (checkpoint / "rng_state_1.pth").is_file()
    # 0 completed steps lost: the first attempt logged no step past its checkpoint, and the
    # second resumed right after it and logged every step to the end.
    assert f"Resuming from {checkpoint}" in second
    attempts: list[list[int]] = []
    log = _events(tmp_path / "out")
    for event in log:
        if event["event"] == "attempt_start":
            attempts.append([])
        elif event["event"] == "step":
            attempts[-1].append(event["step"])
    assert len(attempts) == 2 and max(attempts[0]) == step, attempts
    signalled = next(e["time"] for e in log if e["event"] == "stop_request")
    resumed = next(e["time"] for e in log if e["event"] == "step" and e["step"] == step + 1)
    cluster.timings["2-node time limit: completed steps lost"] = max(attempts[0]) - step
    cluster.timings["2-node time limit: signal to first resumed step (s)"] = resumed - signalled
    # (the end-of-training summary is one more log of the last step)
    assert sorted(set(attempts[1])) == list(range(step + 1, steps + 1)), attempts[1]
    assert (tmp_path / "out" / "maxent_grpo_training_complete.json").is_file()
    left = _ours_left(cluster, str(recipe))
    assert not left, left


@pytest.mark.parametrize(
    ("crash_grace", "launcher_first"),
    [
        # The launcher stops the surviving rank first, as on a real cluster (SlurmdTimeout 300 s),
        # and waits for Slurm's verdict on the node: a requeue of its own before the node is DOWN
        # broke the job's GPU records (Slurm 22.05: it pended on "Resources" for good).
        pytest.param(5, True, id="launcher-first"),
        # Slurm marks the node down (26-42 s after the kill here) while the rank still waits.
        pytest.param(120, False, id="slurm-first"),
    ],
)
def test_a_killed_training_node_fails_the_attempt_in_bounded_time_and_it_resumes_elsewhere(
    multinode_cluster, tmp_path, tiny_model, crash_grace, launcher_first
):
    cluster = multinode_cluster
    out = tmp_path / "out"
    env = {"OMP_NUM_THREADS": "1", "MAXENT_GRPO_CRASH_GRACE_S": str(crash_grace)}
    recipe = _small(tmp_path, tiny_model, max_steps=60, save_steps=10, env=env)
    job = sbatch_training(cluster, tmp_path, recipe, "--nodes=2", "--requeue")
    try:
        # The second node runs a trainer only (the launcher is on the first): its crash must not
        # leave the first node's trainer waiting in a collective until the time limit.
        victim = _second_node_after_a_checkpoint(cluster, job, out)
        t0 = time.monotonic()
        crashed = cluster.cluster("kill-node", victim, timeout=60)
        assert crashed.returncode == 0, crashed.stderr
        outcome = _first_outcome(out, 180)
        ended = time.monotonic() - t0
        cluster.timings[
            f"killed training node ({crash_grace} s grace): attempt ended after (s)"
        ] = ended
        # The reason names the node (srun's line, or the launcher's "node2 went silent"), not
        # the SIGTERM Slurm ended the job with.
        assert outcome["outcome"] == "node_failure" and victim in outcome["reason"], outcome
        assert cluster.wait(job, timeout=300) == "COMPLETED", slurm_out(tmp_path)[-4000:]
        completed = time.monotonic() - t0
        cluster.timings[
            f"killed training node ({crash_grace} s grace): job completed after (s)"
        ] = completed
        assert victim not in cluster.job_nodes(job)
        # Slurm requeued the job when it marked the node down, once; the launcher did not.
        (record,) = cluster.job_records(job)
        printed = slurm_out(tmp_path)
        assert record["Restarts"] == "1", record
        assert f"Slurm requeued {job} itself" in printed and f"requeueing {job}" not in printed
        waited = f"for Slurm to mark {victim} down" in printed
        assert waited == launcher_first, printed[-4000:]
        # No GPU of the healthy nodes is left counted as allocated.
        assert {n: cluster.node_record(n)["GresUsed"] for n in cluster.nodes if n != victim} == {
            n: "gpu:0" for n in cluster.nodes if n != victim
        }
    finally:
        cluster.cancel(job)
        restarted = cluster.cluster("start", "--nodes", str(len(cluster.nodes)), timeout=300)
    assert restarted.returncode == 0, restarted.stderr
    _assert_resumed_once_after_a_node_failure(tmp_path, out)


def _second_node_after_a_checkpoint(cluster, job: str, out: Path) -> str:
    """Wait for the job's first complete checkpoint; its second node (a trainer only: the
    launcher is on the first)."""
    wait_for(
        lambda: list(out.glob("checkpoint-*/maxent_grpo_complete.json")),
        240,
        "a complete checkpoint",
    )
    return cluster.job_nodes(job)[1]


def _first_outcome(out: Path, timeout: float) -> dict:
    return wait_for(
        lambda: next((e for e in _events(out) if e["event"] == "outcome"), None),
        timeout,
        "the first attempt's outcome",
    )


def _assert_resumed_once_after_a_node_failure(tmp_path: Path, out: Path) -> None:
    logs = train_logs(tmp_path)
    assert len(logs) == 2, logs
    assert f"Resuming from {out}/checkpoint-" in logs[1].read_text(errors="replace")
    assert (out / "maxent_grpo_training_complete.json").is_file()
    # one outcome per attempt: the wait for Slurm records nothing twice
    outcomes = [e["outcome"] for e in _events(out) if e["event"] == "outcome"]
    assert outcomes == ["node_failure", "completed"], outcomes


def test_submit_on_two_nodes_runs_one_launcher_and_survives_preemption(
    multinode_cluster, tmp_path, tiny_model
):
    """`maxent-grpo submit --nodes 2`: one launcher (submitit without srun) which trains
    across both nodes; a higher-priority job preempts it (SIGTERM everywhere, GraceTime 30 s,
    Slurm requeues it) and the next attempt resumes where the checkpoint left off."""
    cluster = multinode_cluster
    out = tmp_path / "out"
    recipe = _small(tmp_path, tiny_model, max_steps=40, reward_funcs=[SLOW], reward_weights=None)
    submit = subprocess.run(
        [
            *(MAXENT_GRPO, "submit", "--config", str(recipe), "--nodes", "2", "--gpus", "0"),
            *("--cpus-per-task", "20", "--folder", str(tmp_path / "submitit")),
            *("--logs-dir", str(tmp_path / "logs")),
        ],
        cwd=REPO,
        env={**cluster.env, "SLOW_REWARD_AFTER_STEP": "0", "SLOW_REWARD_S": "0.2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submit.returncode == 0, submit.stderr
    job = re.search(r"submitted job (\d+)", submit.stdout).group(1)
    wait_for(lambda: _steps(out) >= 5, 240, "training to reach step 5")
    assert len(cluster.job_nodes(job)) == 2
    # 20 CPUs on 2 nodes: only the third node has them free, so our job is preempted.
    high = cluster.submit(
        ["-p", "high", "--nodes=2", "--cpus-per-task=20", "-o", str(tmp_path / "high.out")]
        + ["--wrap", "sleep 2"],
        tmp_path,
    )
    assert cluster.wait(high, timeout=150) == "COMPLETED"
    assert cluster.wait(job, timeout=600) == "COMPLETED"

    log = _events(out)
    starts = [e for e in log if e["event"] == "attempt_start"]
    plans = [e for e in log if e["event"] == "plan"]
    outcomes = [e["outcome"] for e in log if e["event"] == "outcome"]
    # One launcher per attempt (no duplicate from a second task), each training on 2 nodes.
    assert len(starts) == 2 and [p["train_processes"] for p in plans] == [2, 2], plans
    assert all(len(p["nodes"]) == 2 for p in plans), plans
    assert outcomes == ["preempted", "completed"], outcomes
    saved = next(e["step"] for e in log if e["event"] == "outcome")
    resumed = [e["step"] for e in log if e["event"] == "step" and e["time"] > starts[1]["time"]]
    assert resumed[0] == saved + 1, (saved, resumed[:3])
    assert (out / "maxent_grpo_training_complete.json").is_file()


def _steps(out: Path) -> int:
    try:
        return max((e["step"] for e in _events(out) if e["event"] == "step"), default=0)
    except OSError:
        return 0


def test_a_silent_training_node_fails_the_attempt_in_bounded_time_and_it_resumes_elsewhere(
    multinode_cluster, tmp_path, tiny_model
):
    """A node whose network goes (cluster.sh cut-node: its link down, nothing killed) sends no
    FIN and no exit: its peers block in a collective and srun hears nothing. Slurm marks it
    DOWN after SlurmdTimeout and requeues the job; the attempt is a node_failure naming it, the
    job finishes on the healthy nodes, and once the link is back nothing of the run is left."""
    cluster = multinode_cluster
    out = tmp_path / "out"
    # ddp_timeout bounds the cut node's own trainer, blocked in a collective with peers that are
    # gone: without it, it ended only when a TCP retransmission (backed off up to 120 s) met the
    # restored link (5-115 s after the restore here).
    recipe = _small(
        tmp_path,
        tiny_model,
        max_steps=60,
        save_steps=10,
        ddp_timeout=60,
        env={"OMP_NUM_THREADS": "1"},
    )
    job = sbatch_training(cluster, tmp_path, recipe, "--nodes=2", "--requeue")
    victim, cut = None, False
    try:
        victim = _second_node_after_a_checkpoint(cluster, job, out)
        t0 = time.monotonic()
        done = cluster.cluster("cut-node", victim, timeout=60)
        cut = done.returncode == 0
        assert cut, done.stderr
        # Bound: SlurmdTimeout (20 s here) + one ping round (~SlurmdTimeout/3) until the node
        # is DOWN, then KillWait (5 s) for the launcher to record it (docs/multinode.md).
        outcome = _first_outcome(out, 90)
        cluster.timings["silent training node: attempt ended after (s)"] = time.monotonic() - t0
        assert outcome["outcome"] == "node_failure" and victim in outcome["reason"], outcome
        assert cluster.wait(job, timeout=300) == "COMPLETED", slurm_out(tmp_path)[-4000:]
        cluster.timings["silent training node: job completed after (s)"] = time.monotonic() - t0
        assert victim not in cluster.job_nodes(job)
        (record,) = cluster.job_records(job)
        assert record["Restarts"] == "1", record
        # The cut node's trainer ran on, unheard; once it hears Slurm again nothing is left.
        done = cluster.cluster("restore-node", victim, timeout=60)
        cut = done.returncode != 0
        assert not cut, done.stderr
        t1 = time.monotonic()
        while (left := _ours_left(cluster, str(recipe))) and time.monotonic() - t1 < 300:
            time.sleep(1)
        gone = time.monotonic() - t1
        cluster.timings["silent training node: its processes gone after restore (s)"] = gone
        assert not left, (gone, left)
    finally:
        if cut:
            cluster.cluster("restore-node", victim, timeout=60)
        cluster.cancel(job)
        restarted = cluster.cluster("start", "--nodes", str(len(cluster.nodes)), timeout=300)
    assert restarted.returncode == 0, restarted.stderr
    _assert_resumed_once_after_a_node_failure(tmp_path, out)
