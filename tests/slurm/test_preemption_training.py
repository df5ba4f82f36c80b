"""A real preemption of a training job on the test cluster: a job in the `high` partition takes
the CPUs of a `sbatch training.sh` job in `debug` (PreemptMode=REQUEUE, GraceTime 30 s,
KillWait 5 s; tests/slurm/cluster.sh).

What Slurm 22.05 does to a single-node training job (its processes are all in the batch step:
the launcher is the batch shell, accelerate and the trainers its children): nothing during
GraceTime, then SIGTERM to every process, then SIGKILL KillWait later. The trainers save at the
next step boundary within KillWait; the job is requeued, resumes, and ends with the weights of
an uninterrupted run: no completed step is lost.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_training_slurm import (
    FRESH,
    KEYS,
    RESUME_STEPS,
    assert_same_weights,
    local_reference_run,
    sbatch_training,
    slurm_out,
    train_logs,
    wait_for,
)

from helpers.recipes import small_recipe

pytestmark = pytest.mark.slurm

GRACE_S = 30  # GraceTime of the debug partition
# Steps of at least 0.7 s in the first attempt (a reward that sleeps there, and only there):
# preempted after step 5, it does at most 5 + GRACE_S / 0.7 = 48 steps before it stops, however
# quiet the machine is, and cannot finish the 100 within 66 s of step 5. The resumed attempt
# trains the rest at full speed; the reference run is shared with test_training_slurm's requeue
# tests.
STEPS = RESUME_STEPS
CPUS = 20  # of the node's 32 declared CPUs: the high job's 20 do not fit beside it


def events(out: Path) -> list[dict]:
    try:
        lines = (out / "events.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def last_step(out: Path) -> int:
    return max((e["step"] for e in events(out) if e["event"] == "step"), default=0)


def test_preempted_training_checkpoints_requeues_resumes_and_loses_no_step(slurm_cluster, tmp_path):
    out = tmp_path / "out"
    path = small_recipe(tmp_path, **KEYS, **FRESH, max_steps=STEPS)
    job = sbatch_training(
        slurm_cluster,
        tmp_path,
        path,
        *(f"--cpus-per-task={CPUS}", "--gres=gpu:0", "--requeue"),
        "--export=ALL,FRESH_START_REWARD_S=0.7",
    )
    wait_for(lambda: last_step(out) >= 5, 240, "training to reach step 5")

    preempted_at = time.time()
    high = slurm_cluster.submit(
        ["-p", "high", f"--cpus-per-task={CPUS}", "-o", str(tmp_path / "high.out")]
        + ["--wrap", "sleep 2"],
        tmp_path,
    )
    assert slurm_cluster.wait(high, timeout=GRACE_S + 90) == "COMPLETED", slurm_out(tmp_path)
    assert slurm_cluster.wait(job, timeout=600) == "COMPLETED", slurm_out(tmp_path)

    log = events(out)
    (stop,) = [e for e in log if e["event"] == "stop_request"]
    first, second = [e for e in log if e["event"] == "attempt_start"]
    outcomes = [e for e in log if e["event"] == "outcome"]
    assert outcomes[0]["outcome"] == "preempted", outcomes
    saved = outcomes[0]["step"]
    done = [e["step"] for e in log if e["event"] == "step" and e["time"] < stop["time"]]
    resumed = [e for e in log if e["event"] == "step" and e["time"] > second["time"]]
    lost = max(done) - saved
    timings = slurm_cluster.timings
    timings["preemption: SIGTERM after the preemption (s)"] = stop["time"] - preempted_at
    timings["preemption: completed steps lost"] = max(0, lost)
    timings["preemption: SIGTERM to first resumed step (s)"] = resumed[0]["time"] - stop["time"]
    timings["preemption: preemption to first resumed step (s)"] = resumed[0]["time"] - preempted_at
    assert lost <= 0, (done[-5:], saved)
    assert resumed[0]["step"] == saved + 1, (resumed[0], saved)
    assert outcomes[-1]["outcome"] == "completed"
    assert first["attempt"] == 0 and second["attempt"] == 1
    # Slurm signalled the batch step only when the grace time ended; training went on until.
    assert stop["time"] - preempted_at >= GRACE_S - 5, stop

    logs = train_logs(tmp_path)
    assert len(logs) == 2, logs
    assert f"Stopped on request after step {saved}" in logs[0].read_text()
    assert f"Resuming from {out / f'checkpoint-{saved}'}" in logs[1].read_text()
    reference = local_reference_run(tmp_path, **FRESH, max_steps=STEPS)
    assert_same_weights(out, reference)


def test_time_limit_signal_is_a_time_limit_outcome_and_requeues(slurm_cluster, tmp_path):
    """What `--signal=B:USR1@N` sends before the time limit, sent now: the attempt is a
    `time_limit`, requeued by the launcher, and the run completes. One trainer process (the
    tests above stop two at one step boundary); steps of 0.5 s or more until the requeue."""
    out = tmp_path / "out"
    path = small_recipe(tmp_path, **KEYS, **FRESH, max_steps=40, num_processes=1)
    job = sbatch_training(
        slurm_cluster,
        tmp_path,
        path,
        *("--cpus-per-task=4", "--gres=gpu:0", "--requeue"),
        "--export=ALL,FRESH_START_REWARD_S=0.5",
    )
    wait_for(lambda: last_step(out) >= 3, 240, "training to reach step 3")
    slurm_cluster.run(["scancel", "--batch", "--signal=USR1", job])
    assert slurm_cluster.wait(job, timeout=600) == "COMPLETED", slurm_out(tmp_path)
    outcomes = [e for e in events(out) if e["event"] == "outcome"]
    assert outcomes[0]["outcome"] == "time_limit" and outcomes[0]["requeue"] == job, outcomes
    assert outcomes[-1]["outcome"] == "completed"
    assert f"requeueing {job}" in slurm_out(tmp_path)


def _training_in(out: Path, attempt: int) -> bool:
    """The run is in its `attempt`-th attempt (1-based), and that attempt has logged a step."""
    log = events(out)
    starts = [i for i, e in enumerate(log) if e["event"] == "attempt_start"]
    return len(starts) == attempt and any(e["event"] == "step" for e in log[starts[-1] :])


def test_a_stop_past_max_requeues_is_not_requeued_and_keeps_its_checkpoint(slurm_cluster, tmp_path):
    """max_requeues: 1. The first time-limit signal requeues the job; the second, in the
    requeued attempt (SLURM_RESTART_COUNT 1), does not: the attempt saves, says why it is not
    requeued and how to continue, and the job ends. Steps sleep 0.5 s in both attempts."""
    out = tmp_path / "out"
    keys = {"reward_funcs": ["tests.helpers.gated_rewards:gated_digit_fraction"]}
    path = small_recipe(
        tmp_path,
        **KEYS,
        **keys,
        reward_weights=None,
        max_steps=400,
        num_processes=1,
        max_requeues=1,
    )
    job = sbatch_training(
        slurm_cluster,
        tmp_path,
        path,
        *("--cpus-per-task=4", "--gres=gpu:0", "--requeue"),
        "--export=ALL,SLOW_REWARD_S=0.5",
    )
    for attempt in (1, 2):
        wait_for(lambda n=attempt: _training_in(out, n), 240, f"attempt {attempt} training")
        slurm_cluster.run(["scancel", "--batch", "--signal=USR1", job])
        wait_for(
            lambda n=attempt: len([e for e in events(out) if e["event"] == "outcome"]) == n,
            240,
            f"attempt {attempt}'s outcome",
        )
    slurm_cluster.wait(job, timeout=300)
    outcomes = [e for e in events(out) if e["event"] == "outcome"]
    assert [o["outcome"] for o in outcomes] == ["time_limit", "time_limit"], outcomes
    assert outcomes[0]["requeue"] == job and outcomes[1].get("requeue") is None, outcomes
    printed = slurm_out(tmp_path)
    assert printed.count(f"requeueing {job}") == 1, printed[-3000:]
    assert (
        "not requeued: requeued 1 times already (max_requeues: 1); resubmit to continue from "
        "the last checkpoint"
    ) in printed, printed[-3000:]
    saved = outcomes[1]["step"]
    assert (out / f"checkpoint-{saved}").is_dir() and saved > outcomes[0]["step"], outcomes
    assert len([e for e in events(out) if e["event"] == "attempt_start"]) == 2  # no third


def test_a_permanent_failure_in_an_array_is_not_retried(slurm_cluster, tmp_path):
    """Out of memory in the first task of an array (torch.OutOfMemoryError from a failpoint,
    see tests/reliability/test_failure_classes.py): the later tasks exit at once with the
    same line instead of training again. One trainer process: what is classified is the one
    failure, not how many processes had it."""
    out = tmp_path / "out"
    path = small_recipe(tmp_path, **KEYS, max_steps=40, num_processes=1)
    job = sbatch_training(
        slurm_cluster,
        tmp_path,
        path,
        *("--cpus-per-task=4", "--gres=gpu:0", "--array=0-2%1"),
        "--export=ALL,MAXENT_GRPO_FAILPOINT=step_begin:2:oom",
        f"--error={tmp_path}/slurm_%j.err",
    )
    assert slurm_cluster.wait(f"{job}_0", timeout=300) == "FAILED", slurm_out(tmp_path)
    started = time.monotonic()
    for task in (1, 2):
        assert slurm_cluster.wait(f"{job}_{task}", timeout=120) == "FAILED"
    assert time.monotonic() - started < 90
    log = events(out)
    assert len([e for e in log if e["event"] == "attempt_start"]) == 1
    (outcome,) = [e for e in log if e["event"] == "outcome"]
    assert outcome["outcome"] == "oom" and outcome["requeue"] is None, outcome
    stderr = "".join(p.read_text() for p in sorted(tmp_path.glob("slurm_*.err")))
    errors = [line for line in stderr.splitlines() if line.startswith("error: oom: out of memory")]
    assert len(errors) == 2, stderr[-3000:]
