"""An environment from a recipe (`environment: module:Class`, rewards/environments.py) and tools
with the rest of the trainer: the check of `maxent-grpo check`, then ONE scripted tool run on
CPU (a module fixture, two trainer builds) that the integration tests below each look at:
MaxEnt-GRPO with LoRA, a rollout filter and the environment together, saved after step 1 and
resumed for step 2 (the `python` tool's episode: tests/test_tool_episode.py; both together make
a prompt of the tools' schemas longer than the tiny model's 1024 positions, and TRL then drops
the tool results).

What stands in for what: the tiny model's sampling is scripted (helpers/scripted_policy.py):
turn 1 calls the environment's `multiply` (6 x 7 on row 0, 6 x 8 on rows 1-3), turn 2 answers
with the tool's result. TRL's environment_factory
path, the tool loop, the masks, the MaxEnt weights, the filter, LoRA, the checkpoint and the
resume are the real code paths. The reward is the environment's get_reward alone
(reward_funcs unset: TRL's environment reward contract), so group 0 (rows 0, 1) has spread and
group 1 (rows 2, 3) has none: nonzero_std drops it.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from helpers.paths import SMOKE_MAXENT
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
TIMES_8 = {"name": "multiply", "arguments": {"a": 6, "b": 8}}
CALLS = ({"name": "multiply", "arguments": {"a": 6, "b": 7}}, TIMES_8, TIMES_8, TIMES_8)


def _check_line(environment: str) -> str:
    with pytest.raises(ConfigError) as caught:
        check_rewards(ScriptArguments(environment=environment), TRAINING)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_check_says_what_scores_the_rollouts(tmp_path, tiny_model):
    """`maxent-grpo check`'s notes (launch/sbatch.check_for): the environment's get_reward,
    alone (the run below) or beside reward_funcs."""
    from maxent_grpo.launch.launcher import RunRequest
    from maxent_grpo.launch.sbatch import check_for

    own = "Calculator.get_reward (the environment's, weight 1, logged as rewards/Calculator/mean)"
    _, notes = check_for(RunRequest(recipe=str(_recipe(tmp_path, tiny_model))), None)
    assert f"reward: {own} alone; reward_funcs is unset or empty" in notes
    both = _recipe(tmp_path, tiny_model, name="both.yaml", reward_funcs=["answer_match"])
    _, notes = check_for(RunRequest(recipe=str(both)), None)
    assert f"rewards: answer_match (reward_funcs) and {own}" in notes


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


def _recipe(folder, tiny_model, reward_funcs=None, **keys):
    return small_recipe(
        folder,
        tiny_model,
        base=SMOKE_MAXENT,
        environment=ENV,
        max_tool_calling_iterations=1,
        chat_template=qwen25_template(),
        reward_funcs=reward_funcs,  # None: the environment's get_reward alone
        reward_weights=None,
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=256,
        learning_rate=1e-2,
        maxent_target_weight_entropy=0.5,  # < log 2: two completions a group
        init_kl_coeff=1.0,  # a large beta: the reference term visibly moves the weights
        use_peft=True,
        lora_r=8,
        lora_alpha=16,
        lora_dropout=0.0,
        lora_target_modules="all-linear",
        rollout_filters=["nonzero_std"],
        save_strategy="steps",
        save_steps=1,
        save_total_limit=None,
        **keys,
    )


def _scripted_trainer(recipe_path):
    from maxent_grpo.recipe import build_recipe, read_recipe
    from maxent_grpo.train.entry import _build_trainer
    from maxent_grpo.train_process import trainer_class

    recipe = build_recipe(read_recipe(["--config", str(recipe_path)]), 1)
    trainer = _build_trainer(recipe, trainer_class(recipe.method))
    widths = script_generate(trainer.model, trainer.processing_class, CALLS)
    return recipe, trainer, widths, record_loss_inputs(trainer)


@pytest.fixture(scope="module")
def tool_run(tmp_path_factory, tiny_model):
    """Step 1 (saved), then a new trainer that resumes from it for step 2."""
    from maxent_grpo.train.entry import _train_from_last_checkpoint

    folder = tmp_path_factory.mktemp("tool_run")
    _, first, first_widths, first_losses = _scripted_trainer(
        _recipe(folder, tiny_model, max_steps=1)
    )
    params = lambda t: {n: p.detach().clone() for n, p in t.model.named_parameters()}  # noqa: E731
    before = params(first)
    first.train()
    recipe, second, second_widths, _ = _scripted_trainer(
        _recipe(folder, tiny_model, max_steps=2, name="resumed.yaml")
    )
    _train_from_last_checkpoint(second, folder / "out", recipe.training)
    return SimpleNamespace(
        first=first,
        second=second,
        inputs=first_losses[0],
        widths=(first_widths, second_widths),
        before=before,
        after=params(first),
        folder=folder,
    )


def _log(trainer, step: int) -> dict:
    (log,) = [e for e in trainer.state.log_history if "loss" in e and e["step"] == step]
    return log


@pytest.mark.integration
def test_environment_and_tool_turns_are_out_of_the_loss(tool_run):
    tokenizer = tool_run.first.processing_class
    pairs = split_by_tool_mask(tokenizer, tool_run.inputs)
    for (kept, masked), prompt in zip(pairs, tool_run.inputs["prompt_ids"], strict=True):
        # reset()'s text reached the prompt; both turns of the policy are in, the result out.
        assert "(You have a multiply tool.)" in tokenizer.decode(prompt)
        assert "<tool_call>" in kept and "<answer>" in kept and "<tool_response>" not in kept
        assert "<tool_response>" in masked
    # The group trained: the environment's answers 42 and 48.
    assert sorted(m.split("<tool_response>")[1].split()[0] for _, m in pairs) == ["42", "48"]
    log = _log(tool_run.first, 1)
    assert log["tools/call_frequency"] == 1.0 and log["tools/failure_frequency"] == 0.0
    # One environment per rollout, each reset once; the environment's own reward.
    envs = tool_run.first.environments
    assert len({id(e) for e in envs}) == 4 and [e.resets for e in envs] == [1, 1, 1, 1]
    # The environment's reward alone scored the batch (1 for the one 42 of 4) and the group
    # it kept (1 and 0).
    assert [k for k in log if k.startswith("rewards/")] == [
        "rewards/Calculator/mean",
        "rewards/Calculator/std",
    ]
    assert log["rewards/Calculator/mean"] == 0.25 and log["reward"] == 0.5


@pytest.mark.integration
def test_rollout_filter_keeps_whole_tool_episodes(tool_run):
    log = _log(tool_run.first, 1)
    assert log["rollouts/groups_generated"] == 2.0 and log["rollouts/groups_trained"] == 1.0
    inputs = tool_run.inputs
    assert inputs["completion_ids"].shape[0] == 2  # the group with spread, every key regrouped
    assert inputs["tool_mask"].shape == inputs["completion_mask"].shape


@pytest.mark.integration
def test_maxent_weights_see_only_the_policy_tokens(tool_run):
    from maxent_grpo.maxent.weights import maxent_weights, sequence_log_likelihood

    trainer, inputs = tool_run.first, tool_run.inputs
    config = trainer.args
    answers = [kept for kept, _ in split_by_tool_mask(trainer.processing_class, inputs)]
    rewards = torch.tensor([1.0 if "<answer>42</answer>" in a else 0.0 for a in answers])

    def weights(mask):
        ref = sequence_log_likelihood(inputs["ref_per_token_logps"], mask, True)
        return maxent_weights(
            rewards,
            2,
            tau=config.maxent_tau,
            beta=config.init_kl_coeff,
            ref_log_likelihood=ref,
            q_temperature=config.maxent_q_temperature,
            q_epsilon=config.maxent_q_epsilon,
        )

    policy_only = weights(inputs["completion_mask"] * inputs["tool_mask"])
    with_tool_output = weights(inputs["completion_mask"])
    assert torch.allclose(inputs["maxent_weights"], policy_only, atol=1e-6)
    assert not torch.allclose(with_tool_output, policy_only, atol=1e-5)  # 3e-4 apart here


@pytest.mark.integration
def test_lora_trains_only_the_adapter(tool_run):
    changed = {n for n, p in tool_run.after.items() if not torch.equal(p, tool_run.before[n])}
    assert changed and all("lora_" in n for n in changed)


@pytest.mark.integration
def test_a_stopped_tool_run_resumes(tool_run):
    first_widths, second_widths = tool_run.widths
    assert len(first_widths) == 2 and len(second_widths) == 2  # one step each: two turns
    second = tool_run.second
    assert second.state.global_step == 2
    assert _log(second, 1) == _log(tool_run.first, 1)  # the history came from checkpoint-1
    assert _log(second, 2)["tools/call_frequency"] == 1.0
    assert (tool_run.folder / "out" / "checkpoint-2").is_dir()
