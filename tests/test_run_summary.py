"""The line a completed run ends with (rundir/summary.py, printed by the launcher's finish)."""

from __future__ import annotations

from maxent_grpo.rundir.summary import run_summary


def _events():
    return [
        {"time": 100.0, "event": "attempt_start"},
        {"time": 110.0, "event": "step", "step": 1, "metrics": {"reward": 0.125, "loss": 1.0}},
        {"time": 120.0, "event": "step", "step": 2, "metrics": {"reward": float("nan")}},
        {"time": 150.0, "event": "step", "step": 8, "metrics": {"reward": 0.75}},
        {"time": 195.4, "event": "outcome", "outcome": "completed", "step": 8},
    ]


def test_steps_reward_first_to_last_checkpoint_and_time():
    line = run_summary(_events(), "outputs/r/checkpoint-8")
    assert line == (
        "summary: 8 steps, reward 0.125 -> 0.750, checkpoint outputs/r/checkpoint-8, 1m35s"
    )


def test_sft_is_judged_by_its_loss_and_a_run_may_have_no_checkpoint():
    events = [
        {"time": 0.0, "event": "step", "step": 1, "metrics": {"loss": 2.5}},
        {"time": 7200.0, "event": "step", "step": 3, "metrics": {"loss": 0.5}},
    ]
    assert (
        run_summary(events, None) == "summary: 3 steps, loss 2.500 -> 0.500, no checkpoint, 2h00m"
    )
    assert run_summary([], None) == "summary: no step logged, no checkpoint"
