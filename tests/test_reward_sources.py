"""reward_funcs may be left unset when the environment scores rollouts itself (get_reward,
which TRL 1.16 adds as one more reward); `check` still refuses a recipe with no reward at all."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from maxent_grpo.errors import ConfigError
from maxent_grpo.preflight import check_rewards
from maxent_grpo.recipe.script_keys import ScriptArguments
from maxent_grpo.rewards.environments import reward_names

TRAINING = SimpleNamespace(max_completion_length=32, reward_weights=None)
SCORING = "helpers.tool_envs:Calculator"  # defines get_reward
SILENT = "helpers.tool_envs:Sleepy"  # does not


class Scores:
    def reset(self, **row):
        return None

    def get_reward(self) -> float:
        return 1.0


def test_unset_rewards_are_none_with_a_scoring_environment_else_answer_match():
    assert reward_names(None, Scores) == []
    assert reward_names(None, None) == ["answer_match"]
    assert reward_names(None, type("Silent", (), {"reset": lambda self: None})) == ["answer_match"]
    assert reward_names(["format"], Scores) == ["format"]  # given: as given


def test_check_accepts_an_environment_reward_alone():
    check_rewards(ScriptArguments(environment=SCORING), TRAINING)
    check_rewards(ScriptArguments(environment=SCORING, reward_funcs=[]), TRAINING)
    weighted = SimpleNamespace(max_completion_length=32, reward_weights=[1.0])
    with pytest.raises(ConfigError, match=r"1 weights for 0 reward_funcs \(none\)"):
        check_rewards(ScriptArguments(environment=SCORING), weighted)


@pytest.mark.parametrize(
    "keys", [{"reward_funcs": []}, {"reward_funcs": [], "environment": SILENT}]
)
def test_check_refuses_a_recipe_with_no_reward_at_all(keys):
    with pytest.raises(ConfigError) as info:
        check_rewards(ScriptArguments(**keys), TRAINING)
    assert str(info.value).startswith(
        "reward_funcs: empty and no environment with get_reward scores the rollouts"
    )
    assert "\n" not in str(info.value)
