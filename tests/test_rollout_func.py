"""The recipe's own rollout function (`rollout_func`): refused by `check` in one line when it
cannot be imported, called or combined; trained on for real (the tiny model, 2 CPU steps, one
process) with the shipped two-turn self-check (maxent_grpo.train.rollout_func:self_check)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from helpers import rollout_funcs
from helpers.recipes import SMOKE, SMOKE_MAXENT, small_recipe
from helpers.scripted_policy import record_loss_inputs, split_by_tool_mask
from maxent_grpo import cli
from maxent_grpo.errors import ConfigError
from maxent_grpo.rollout_func import find_rollout_func
from maxent_grpo.train.rollout_func import CHECK_TEXT, self_check

RECORDING = "helpers.rollout_funcs:recording_self_check"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz:f' (ModuleNotFoundError"),
        ("math:no_such_function", "cannot import 'math:no_such_function' (AttributeError"),
        ("math:pi", "is not callable"),
        ("self_check", "is not module:function"),
        ("helpers.rollout_funcs:wrong_signature", "takes (prompts), but TRL calls it as"),
    ],
)
def test_a_bad_rollout_func_is_one_line_naming_the_key(name, message):
    with pytest.raises(ConfigError) as caught:
        find_rollout_func(name)
    text = str(caught.value)
    assert text.startswith("rollout_func: ") and message in text and "\n" not in text


def test_the_shipped_example_is_found():
    assert find_rollout_func("maxent_grpo.train.rollout_func:self_check") is self_check


def _check(capsys, path) -> tuple[int, list[str]]:
    code = cli.main(["check", "--config", str(path)])
    return code, [line for line in capsys.readouterr().err.splitlines() if "error" in line]


def test_check_refuses_a_rollout_func_that_does_not_import(tmp_path, tiny_model, capsys):
    path = small_recipe(tmp_path, tiny_model, rollout_func="no_such_module_xyz:generate")
    code, errors = _check(capsys, path)
    assert code != 0
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"error: {path}: rollout_func: cannot import")
    assert "no_such_module_xyz:generate" in errors[0] and "fix the module path" in errors[0]


def test_what_would_generate_beside_it_is_refused_in_one_line(tmp_path):
    from maxent_grpo.recipe.keys import GRPOConfig
    from maxent_grpo.recipe.rules import check_rollout_func

    training = SimpleNamespace(rollout_func=RECORDING, async_generation=False)
    check_rollout_func(training, SimpleNamespace(tools=None, environment=None))
    with pytest.raises(ConfigError) as caught:  # preflight: the script section's tools
        check_rollout_func(training, SimpleNamespace(tools=["python"], environment="m:Env"))
    assert str(caught.value).startswith(f"rollout_func: {RECORDING!r} with tools and environment")
    with pytest.raises(ConfigError, match="with async_generation: the rollout function"):
        GRPOConfig(output_dir=str(tmp_path), rollout_func=RECORDING, async_generation=True)


def test_check_passes_the_shipped_example(tmp_path, tiny_model, capsys):
    path = small_recipe(tmp_path, tiny_model, rollout_func=RECORDING)
    code, errors = _check(capsys, path)
    assert code == 0 and not errors, errors


def _train(folder, tiny_model, base=SMOKE, **keys) -> SimpleNamespace:
    """Two steps (GRPO, or `base`'s method) whose completions the self-check makes."""
    from maxent_grpo.recipe import build_recipe, read_recipe
    from maxent_grpo.train.entry import _build_trainer
    from maxent_grpo.train_process import trainer_class

    path = small_recipe(
        folder,
        tiny_model,
        base,
        rollout_func=RECORDING,
        reward_funcs=["helpers.rollout_funcs:seven"],
        reward_weights=[1.0],
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=64,  # the tiny tokenizer: about a token a character
        learning_rate=1e-2,
        max_steps=2,
        **keys,
    )
    recipe = build_recipe(read_recipe(["--config", str(path)]), 1)
    trainer = _build_trainer(recipe, trainer_class(recipe.method))
    rollout_funcs.script_generate(trainer.model, trainer.processing_class)
    rollout_funcs.CALLS.clear()
    rollout_funcs.SCORED.clear()
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    losses = record_loss_inputs(trainer)
    trainer.train()
    return SimpleNamespace(
        trainer=trainer,
        calls=list(rollout_funcs.CALLS),
        scored=list(rollout_funcs.SCORED),
        losses=losses,
        before=before,
    )


@pytest.fixture(scope="module")
def self_checked(tmp_path_factory, tiny_model):
    return _train(tmp_path_factory.mktemp("rollout_func"), tiny_model)


@pytest.mark.integration
def test_the_rollout_func_makes_every_step_s_completions(self_checked):
    calls = self_checked.calls
    assert len(calls) == 2  # one generation per step
    for call in calls:
        prompts = call["prompts"]  # this process's rows: each prompt num_generations times
        assert len(prompts) == 4 and prompts[0] == prompts[1] and prompts[2] == prompts[3]
        assert call["output"]["self_checked"] == [True] * 4
    # The function's extra field reached the reward function, row by row.
    assert self_checked.scored == [[True] * 4, [True] * 4]


@pytest.mark.integration
def test_its_completions_are_trained_on_with_the_check_text_out_of_the_loss(self_checked):
    tokenizer = self_checked.trainer.processing_class
    for call, inputs in zip(self_checked.calls, self_checked.losses, strict=True):
        made = sorted(tuple(ids) for ids in call["output"]["completion_ids"])
        ids, mask = inputs["completion_ids"], inputs["completion_mask"].bool()
        trained = sorted(tuple(row[m].tolist()) for row, m in zip(ids, mask, strict=True))
        assert trained == made  # the loss saw exactly what the function returned
        for kept, masked in split_by_tool_mask(tokenizer, inputs):
            assert masked == CHECK_TEXT  # inserted text: out of the loss
            assert kept.startswith("<answer>") and kept.endswith(" checked<|im_end|>"), kept
    log = [e for e in self_checked.trainer.state.log_history if "loss" in e][0]
    assert log["reward_std"] > 0  # 7 and x in each group: an advantage
    changed = [
        n
        for n, p in self_checked.trainer.model.named_parameters()
        if not torch.equal(p.detach(), self_checked.before[n])
    ]
    assert changed, "training on the rollout function's completions changed no weight"


def _trained_completions(inputs) -> list[tuple]:
    ids, mask = inputs["completion_ids"], inputs["completion_mask"].bool()
    return sorted(tuple(row[m].tolist()) for row, m in zip(ids, mask, strict=True))


@pytest.mark.integration
def test_the_rounds_filter_and_carry_over_its_groups(tmp_path, tiny_model):
    """MaxEnt-GRPO here (the other tests: GRPO): its weights and loss over the function's."""
    run = _train(
        tmp_path,
        tiny_model,
        SMOKE_MAXENT,
        rollout_filters=["nonzero_std"],
        oversample_factor=2.0,
        maxent_target_weight_entropy=0.5,  # < log 2: two completions a group
        overlong_buffer=None,  # soft_overlong_punishment is not among the rewards
    )
    assert run.trainer.method == "maxent"
    # Step 1's one round generates for its 2 prompts and 2 more (8 rows, one call); step 2
    # trains on the 2 groups carried over, with no call.
    (call,) = run.calls
    assert len(call["prompts"]) == 8
    logs = [e for e in run.trainer.state.log_history if "loss" in e]
    assert [e["rollouts/rounds"] for e in logs] == [1.0, 0.0]
    assert [e["rollouts/carried_in"] for e in logs] == [0.0, 2.0]
    made = sorted(tuple(ids) for ids in call["output"]["completion_ids"])
    trained = sorted(_trained_completions(run.losses[0]) + _trained_completions(run.losses[1]))
    assert trained == made  # every group the function made, trained once
