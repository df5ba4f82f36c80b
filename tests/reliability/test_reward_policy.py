"""The reward failure policy: a reward that raises or hangs on one sample never ends the run
and never scores a silent 0: that sample scores None (skipped), counted and logged."""

from __future__ import annotations

import pytest

from helpers.flaky_rewards import hangs_on_odd, raises_on_odd
from helpers.recipes import write_recipe
from helpers.runs import PYTHON, REPO, run, step_logs
from maxent_grpo.rewards import GuardedReward, get_reward_funcs, guard_rewards

COMPLETIONS = ["a", "b", "c", "d"]
SOLUTIONS = ["2", "17", "4", "27"]


def test_raising_reward_scores_none_for_the_bad_samples_only():
    metrics = {}
    guarded = GuardedReward(raises_on_odd, timeout=10)
    scores = guarded(COMPLETIONS, solution=SOLUTIONS, log_metric=metrics.__setitem__)
    assert scores == [1.0, None, 1.0, None]
    assert metrics == {"rewards/raises_on_odd/failures": 2.0}
    assert guarded.__name__ == "raises_on_odd"


def test_hanging_reward_times_out_per_sample():
    metrics = {}
    guarded = GuardedReward(hangs_on_odd, timeout=0.2)
    scores = guarded(COMPLETIONS, solution=SOLUTIONS, log_metric=metrics.__setitem__)
    assert scores == [1.0, None, 1.0, None]
    assert metrics["rewards/hangs_on_odd/failures"] == 2.0


def test_healthy_rewards_pass_through_unchanged():
    (accuracy,) = guard_rewards(get_reward_funcs(["answer_match"]), timeout=10)
    metrics = {}
    scores = accuracy(
        ["<answer>3</answer>", "<answer>4</answer>"],
        solution=["3", "3"],
        log_metric=metrics.__setitem__,
    )
    assert scores == [1.0, 0.0]
    assert metrics == {}  # no failure, no metric: TRL would gather a zero across processes


@pytest.mark.integration
def test_training_survives_a_reward_that_raises(tmp_path, tiny_model):
    recipe = write_recipe(
        tmp_path,
        model_name_or_path=str(tiny_model),
        reward_funcs=["answer_match", "tests.helpers.flaky_rewards:raises_on_odd"],
        reward_weights=[1.0, 1.0],
        dataset_num_rows=64,
        max_completion_length=8,
        max_steps=6,
        save_steps=1000,
    )
    result = run([PYTHON, str(REPO / "src" / "grpo.py"), "--config", str(recipe)])
    assert result.returncode == 0, result.stderr[-3000:]
    logs = step_logs(tmp_path / "out")
    failures = [float(log.get("rewards/raises_on_odd/failures", 0)) for log in logs.values()]
    assert len(failures) == 6 and sum(failures) > 0
    assert all("rewards/answer_match/failures" not in log for log in logs.values())
    assert "scored None (ValueError: cannot score odd answers)" in (result.stdout + result.stderr)
