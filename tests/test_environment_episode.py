"""An environment from a recipe (`environment: module:Class`, rewards/environments.py): the check
of `maxent-grpo check`, and an episode through our GRPO trainer on CPU where the environment's
turn is masked out of the loss and its get_reward scores the rollout.

What stands in for what: the tiny model's sampling is scripted (helpers/scripted_policy.py):
turn 1 calls the environment's `multiply` (6 x 7, or 6 x 8 on odd rows), turn 2 answers with
the product. TRL's environment_factory path, the tool loop, the mask and the update are real.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from helpers.recipes import small_recipe
from helpers.scripted_policy import (
    qwen25_template,
    record_loss_inputs,
    script_generate,
    split_by_tool_mask,
)
from maxent_grpo.errors import ConfigError
from maxent_grpo.preflight import check_rewards
from maxent_grpo.recipe.script_keys import ScriptArguments
from maxent_grpo.rewards import RewardTimeout
from maxent_grpo.rewards.environments import get_environment

ENV = "helpers.tool_envs:Calculator"
TRAINING = SimpleNamespace(max_completion_length=32, reward_weights=None)
MULTIPLY = (
    {"name": "multiply", "arguments": {"a": 6, "b": 7}},
    {"name": "multiply", "arguments": {"a": 6, "b": 8}},
)


def _check_line(environment: str) -> str:
    with pytest.raises(ConfigError) as caught:
        check_rewards(ScriptArguments(environment=environment), TRAINING)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_check_passes_an_environment_and_refuses_a_bad_one_in_one_line():
    check_rewards(ScriptArguments(environment=ENV), TRAINING)
    assert _check_line("mypkg.envs:Calculator").startswith(
        "cannot load environment 'mypkg.envs:Calculator': ModuleNotFoundError"
    )
    assert "no reset method" in _check_line("helpers.tool_envs:NoReset")
    assert "multiply': " in _check_line("helpers.tool_envs:Undocumented")
    assert "not a class" in _check_line("helpers.tool_envs:not_a_class")


def test_environment_methods_get_the_recipe_tool_limits():
    settings = ScriptArguments(tool_timeout_seconds=0.5, tool_output_max_chars=3).tool_settings()
    cls = get_environment(ENV, settings)
    assert cls.__name__ == "Calculator"  # TRL names the environment's reward after it
    assert cls().multiply(a=1000, b=1000) == "100\n[... 4 more characters cut]"
    sleepy = get_environment("helpers.tool_envs:Sleepy", settings)()
    began = time.monotonic()
    with pytest.raises(RewardTimeout):
        sleepy.wait(seconds=5)
    assert time.monotonic() - began < 2


@pytest.mark.integration
def test_environment_episode_masks_the_environment_turn_and_scores_with_its_reward(
    tmp_path, tiny_model
):
    from maxent_grpo.recipe import build_recipe, read_recipe
    from maxent_grpo.train.entry import _build_trainer
    from maxent_grpo.train_process import trainer_class

    recipe = small_recipe(
        tmp_path,
        tiny_model,
        environment=ENV,
        max_tool_calling_iterations=1,
        chat_template=qwen25_template(),
        reward_funcs=["helpers.tool_rewards:answer_is_42"],
        reward_weights=None,
        num_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=256,
        learning_rate=1e-2,
        max_steps=1,
        save_strategy="no",
    )
    trainer = _build_trainer(
        build_recipe(read_recipe(["--config", str(recipe)]), 1), trainer_class("grpo")
    )
    tokenizer = trainer.processing_class
    widths = script_generate(trainer.model, tokenizer, MULTIPLY)
    losses = record_loss_inputs(trainer)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()

    assert len(widths) == 2  # the first turn, then the turn after the environment's answer
    # One environment per rollout, each reset once; reset's text reached the prompt.
    envs = trainer.environments
    assert len(envs) == 2 and len({id(e) for e in envs}) == 2
    assert [e.resets for e in envs] == [1, 1] and sorted(e.results[0] for e in envs) == [42, 48]
    (inputs,) = losses
    for (kept, masked), prompt in zip(
        split_by_tool_mask(tokenizer, inputs), inputs["prompt_ids"], strict=True
    ):
        assert "(You have a multiply tool.)" in tokenizer.decode(prompt)
        assert "<tool_call>" in kept and "<answer>" in kept and "<tool_response>" not in kept
        assert "<tool_response>" in masked and ("42" in masked or "48" in masked)
    (log,) = [e for e in trainer.state.log_history if "loss" in e]
    assert log["tools/call_frequency"] == 1.0 and log["tools/failure_frequency"] == 0.0
    # Two rewards: the recipe's (the answer) and the environment's get_reward (its state).
    assert log["rewards/answer_is_42/mean"] == 0.5 and log["rewards/Calculator/mean"] == 0.5
    assert log["reward"] == 1.0
    after = list(trainer.model.parameters())
    assert any(not torch.equal(b, a.detach()) for b, a in zip(before, after, strict=True))
