"""The chaos campaign under Slurm (helpers.chaos_slurm): the draw and the harness's own reading
of processes (pure or a few `sleep`s: every lane), and real trials on the test cluster, opt-in:
two on the 1-node cluster (marker slurm: `make test-slurm`, MAXENT_GRPO_SLURM_TESTS=1) and one
network cut on the 3-node cluster (marker multinode: `make test-multinode`)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
from dataclasses import replace

import pytest

from helpers.chaos_slurm import (
    SERVER_FAULTS,
    SLURM_FAULTS,
    SLURM_SEEDS,
    SLURM_VLLM_SEEDS,
    job_pids,
    sigterm_came,
    slurm_expected,
    slurm_trial_from_seed,
)
from helpers.paths import PYTHON, REPO
from helpers.runs import child_env

SPEC = importlib.util.spec_from_file_location("chaos_bench", REPO / "bench" / "chaos.py")
chaos = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(chaos)


def test_slurm_seeds_draw_slurm_trials_and_the_campaign_goes_round_their_faults():
    trials = chaos.draw(1, 2 * len(SLURM_FAULTS), clusters=("1node",))
    assert all(t.seed >= SLURM_SEEDS and t.kind.cluster == "1node" for t in trials)
    assert {t.fault for t in trials} == set(SLURM_FAULTS)
    assert all(chaos.trial_from_seed(t.seed) == t for t in trials)  # pure: a seed replays
    cuts = chaos.draw(1, 3, clusters=("3node",))
    assert {(t.fault, t.kind.cluster, t.kind.server) for t in cuts} == {
        ("network_cut", "3node", True)
    }
    # Below SLURM_SEEDS nothing changed: the committed record's seeds draw what they drew.
    assert chaos.trial_from_seed(1837981534).kind.cluster == "none"
    preempt = next(t for t in trials if t.fault == "slurm_preempt")
    assert slurm_expected(preempt) == ("preempted",)
    limit = slurm_trial_from_seed(next(t.seed for t in trials if t.fault == "slurm_time_limit"))
    assert slurm_expected(limit) == (("completed",) if limit.step == 6 else ("time_limit",))


def test_servers_only_on_one_node_draws_vllm_trials_from_seeds_of_their_own():
    """`--slurm 1node --servers-only`: a vLLM CPU server in every job, the server a target
    too; the Slurm seeds below SLURM_VLLM_SEEDS draw what they drew (the record's)."""
    trials = chaos.draw(1, 12, servers="only", clusters=("1node",))
    assert all(t.seed >= SLURM_VLLM_SEEDS and t.kind.server for t in trials)
    assert {t.kind.cluster for t in trials} == {"1node"}
    assert {"weight_push", "generation"} <= {t.moment for t in trials}
    assert set(SERVER_FAULTS) & {t.fault for t in trials}
    assert all(chaos.trial_from_seed(t.seed) == t for t in trials)
    old = chaos.trial_from_seed(3242996796)
    assert (old.kind.name, old.moment, old.step, old.fault) == (
        "maxent-1p-1node",
        "optimizer_step",
        3,
        "sigkill_launcher",
    )


def test_a_stop_the_launcher_forwards_may_land_a_step_later_a_ranks_own_does_not():
    """Seed 3667576542: a preemption at optimizer_step:5 with two ranks stopped at step 6, the
    run's end (the SIGTERM reached the ranks through the launcher after step 5's vote):
    `completed` or `preempted`. Seed 4183528094: a rank's own SIGTERM at the same moment is in
    that step's vote (cast right after the point): step 5, `stopped` alone."""
    preempted = chaos.trial_from_seed(3667576542)
    assert (preempted.kind.procs, preempted.moment, preempted.step) == (2, "optimizer_step", 5)
    assert slurm_expected(preempted) == ("preempted", "completed")
    assert slurm_expected(replace(preempted, step=4)) == ("preempted",)
    assert slurm_expected(replace(preempted, step=6)) == ("completed",)
    own = chaos.trial_from_seed(4183528094)
    assert (own.kind.procs, own.moment, own.step, own.fault) == (
        2,
        "optimizer_step",
        5,
        "sigterm_trainer",
    )
    assert slurm_expected(own) == ("stopped",)
    # Mid-checkpoint the step's end has passed: the next step's end, the last one here.
    assert slurm_expected(replace(own, moment="checkpoint_write")) == ("completed",)
    limit = replace(preempted, fault="slurm_time_limit", moment="checkpoint_write", step=4)
    assert slurm_expected(limit) == ("time_limit", "completed")


def test_the_harness_sees_a_held_process_get_its_sigterm_and_only_its_jobs_processes():
    held = subprocess.Popen(["sleep", "30.54"], env={**os.environ, "SLURM_JOB_ID": "987654"})
    other = subprocess.Popen(["sleep", "30.55"], env={**os.environ, "SLURM_JOB_ID": "9876540"})
    try:
        os.kill(held.pid, signal.SIGSTOP)
        time.sleep(0.2)
        assert not sigterm_came(held.pid)  # stopped, nothing pending: Slurm's signal not there
        os.kill(held.pid, signal.SIGTERM)
        time.sleep(0.2)
        assert sigterm_came(held.pid)  # pending at the stopped process
        assert job_pids("987654") == [held.pid]  # not job 9876540's
    finally:
        for proc in (held, other):
            proc.kill()
            proc.wait(10)
    assert sigterm_came(held.pid) and job_pids("987654") == []


def _campaign(tmp_path, args: list[str], timeout: float) -> dict:
    output = tmp_path / "chaos.json"
    command = [PYTHON, "bench/chaos.py", *args, "--output", str(output)]
    result = subprocess.run(
        command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    report = json.loads(output.read_text())
    summary = report["summary"]
    assert summary["survived"] == summary["trials"] == len(report["rows"]), summary
    assert (summary["steps_lost"], summary["orphans"], summary["corrupted"]) == (0, 0, 0)
    assert all(r["reached"] and r["applied"] and r["recovered"] for r in report["rows"])
    return report


@pytest.mark.slurm
@pytest.mark.skipif(
    os.environ.get("MAXENT_GRPO_SLURM_TESTS") != "1",
    reason="real Slurm chaos trials: make test-slurm (MAXENT_GRPO_SLURM_TESTS=1)",
)
def test_slurm_trials_recover_by_requeue_and_keep_every_invariant(tmp_path):
    """A preemption by the high partition (Slurm requeues the job) and a SIGKILLed rank (the
    launcher requeues it): each resumed in the same job, from the newest complete checkpoint."""
    report = _campaign(
        tmp_path, ["--slurm", "1node", "--replay", "3139047903", "--replay", "3777918614"], 1500
    )
    assert [r["outcome"] for r in report["rows"]] == ["preempted", "crash"]
    assert all(r["slurm_requeues"] >= 1 and r["resubmitted"] == 0 for r in report["rows"])


@pytest.mark.multinode
@pytest.mark.skipif(
    os.environ.get("MAXENT_GRPO_MULTINODE_TESTS") != "1",
    reason="a server node's network cut: make test-multinode (MAXENT_GRPO_MULTINODE_TESTS=1)",
)
def test_a_server_nodes_network_cut_loses_nothing(tmp_path):
    report = _campaign(tmp_path, ["--slurm", "3node", "--replay", "3784743375"], 1800)
    (row,) = report["rows"]
    assert row["outcome"] == "completed" and row["steps_redone"] == 0, row
