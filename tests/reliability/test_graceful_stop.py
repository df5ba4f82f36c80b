"""SIGTERM to every process of a run (what Slurm preemption, scancel and a node drain do) is a
graceful stop: the trainers finish the step in progress, save a complete checkpoint and exit;
torchrun's agent forwards the signal and waits for them instead of killing them.

Real launcher, 2 CPU training processes (gloo), the tiny model; the signals go to every pid of
the launcher's process tree at once, as Slurm sends them to every process of a job.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from helpers.launched import Launched, outcomes, steps
from helpers.procs import wait_for, wait_until_gone
from helpers.recipes import small_recipe, write_recipe
from helpers.resume import assert_resumed_from, event_count
from maxent_grpo.rundir.checkpoints import last_complete_checkpoint, list_checkpoints

pytestmark = pytest.mark.integration


def step_of(checkpoint: Path | None) -> int | None:
    return int(checkpoint.name.split("-")[1]) if checkpoint else None


def test_sigterm_to_every_process_checkpoints_the_last_completed_step(tmp_path, tiny_model):
    out = tmp_path / "out"
    run = Launched(tmp_path, small_recipe(tmp_path, tiny_model, max_steps=2000))
    run.wait_for_step(out, 3)
    done_before = max(steps(out))
    pids = run.signal_all(signal.SIGTERM)
    signalled = time.monotonic()
    assert len(pids) >= 4, pids  # launcher, accelerate's agent, 2 trainers
    assert run.wait(timeout=120) == 85, run.text[-3000:]
    took = time.monotonic() - signalled

    checkpoint = last_complete_checkpoint(out)
    assert checkpoint is not None, run.text[-3000:]
    lost = done_before - step_of(checkpoint)
    print(f"\nMEASURED SIGTERM to all: steps lost {max(0, lost)}, exit after {took:.1f}s")
    assert lost <= 0, (done_before, checkpoint)  # every completed step is in the checkpoint
    logs = run.logs()
    assert "SIGTERM received by rank 0" in logs and "SIGTERM received by rank 1" in logs
    assert f"Stopped on request after step {step_of(checkpoint)}" in logs
    (outcome,) = outcomes(out)
    assert (outcome["outcome"], outcome["step"]) == ("stopped", step_of(checkpoint))
    left, _ = wait_until_gone(marker=str(tmp_path), timeout=20)
    assert not left, left

    # The same command resumes from it (a shorter max_steps, accepted as a change).
    step = step_of(checkpoint)
    write_recipe(tmp_path, base=tmp_path / "recipe.yaml", max_steps=step + 2)
    before = event_count(out)
    again = Launched(tmp_path, tmp_path / "recipe.yaml", flags=["--accept-changes"])
    assert again.wait(timeout=300) == 0, again.text[-3000:]
    assert_resumed_from(out, before, step, step + 2, log=again.logs())


def test_grace_shorter_than_a_step_keeps_the_last_periodic_checkpoint(tmp_path, tiny_model):
    """SIGTERM in the middle of a slow step, SIGKILL 1 s later (Slurm's KillWait after a short
    grace time): the stop cannot finish its step, and the last periodic checkpoint stays
    complete and resumable; nothing half-written is ever taken for a checkpoint."""
    out = tmp_path / "out"
    slow = "tests.helpers.slow_rewards:slow_digit_fraction"
    path = small_recipe(
        tmp_path, tiny_model, max_steps=2000, save_steps=2, reward_funcs=[slow], reward_weights=None
    )
    mark = tmp_path / "slow_reward.mark"
    env = dict(SLOW_REWARD_AFTER_STEP="4", SLOW_REWARD_S="8", SLOW_REWARD_MARK=str(mark))
    run = Launched(tmp_path, path, **env)
    wait_for(lambda: mark.is_file(), 240, "step 5's slow reward", 0.05, run.proc)
    assert "sleeping in step 5" in mark.read_text()  # inside step 5, in the slow reward
    run.signal_all(signal.SIGTERM)
    time.sleep(1)  # Slurm's short grace before its SIGKILL: not a wait for a state
    run.signal_all(signal.SIGKILL)
    run.wait(timeout=30)
    left, _ = wait_until_gone(marker=str(tmp_path), timeout=20)
    assert not left, left

    assert [c.step for c in list_checkpoints(out) if c.complete][-1] == 4
    assert last_complete_checkpoint(out) == out / "checkpoint-4"
    write_recipe(tmp_path, base=path, max_steps=6)
    before = event_count(out)
    again = Launched(tmp_path, path, flags=["--accept-changes"])
    assert again.wait(timeout=300) == 0, again.text[-3000:]
    assert_resumed_from(out, before, checkpoint=4, max_steps=6, log=again.logs())


def test_a_killed_launcher_still_stops_its_run_gracefully(tmp_path, tiny_model):
    """`kill -9` of the launcher (no handler can run): its children get SIGTERM from the
    kernel (parent-death signal), the trainers save the step in progress, nothing is left."""
    out = tmp_path / "out"
    run = Launched(tmp_path, small_recipe(tmp_path, tiny_model, max_steps=2000))
    run.wait_for_step(out, 3)
    done_before = max(steps(out))
    tree = run.tree()
    run.proc.kill()
    run.wait(timeout=30)
    left, waited = wait_until_gone(set(), marker=str(tmp_path), timeout=120)
    assert not left, left
    print(f"\nMEASURED launcher SIGKILL -> every process gone: {waited:.1f}s")
    checkpoint = last_complete_checkpoint(out)
    assert checkpoint is not None and step_of(checkpoint) >= done_before, (checkpoint, tree)
