"""A tool-using episode of two turns through our GRPO trainer on CPU: generation, TRL's
tool-calling loop with the sandboxed `python` tool, the loss mask, the reward, an optimizer step.

What stands in for what: the tiny random model would never write a tool call, so its sampling
is scripted (helpers/scripted_policy.py): turn 1 writes a `<tool_call>` running `print(6*7)`
(`print(6*8)` on odd rows, so the group's rewards differ), turn 2 answers with the number the
tool returned. TRL's parsing, our sandbox, the tool mask, the reward and the update are real.
"""

from __future__ import annotations

import re

import pytest
import torch

from helpers.recipes import small_recipe
from helpers.scripted_policy import (
    qwen25_template,
    record_loss_inputs,
    script_generate,
    split_by_tool_mask,
)

pytestmark = pytest.mark.integration


def test_two_turn_episode_with_a_sandboxed_python_call_masks_and_trains(tmp_path, tiny_model):
    from helpers import tool_rewards
    from maxent_grpo.recipe import build_recipe, read_recipe
    from maxent_grpo.train.entry import _build_trainer
    from maxent_grpo.train_process import trainer_class

    # The recipe's path: its tools and chat template reach TRL through train/entry.py.
    recipe = small_recipe(
        tmp_path,
        tiny_model,
        tools=["python"],
        tool_timeout_seconds=5.0,
        max_tool_calling_iterations=2,
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
    seen = tool_rewards.SEEN
    seen.clear()
    widths = script_generate(trainer.model, tokenizer)
    losses = record_loss_inputs(trainer)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()

    # Two generate calls: the first turn, then the turn after the tool result.
    assert len(widths) == 2
    # The episodes: assistant (tool call), tool (the sandbox's output), assistant (answer).
    episode = seen[0]
    assert [m["role"] for m in episode] == ["assistant", "tool", "assistant"]
    assert {m["content"].strip() for c in seen for m in c if m["role"] == "tool"} == {"42", "48"}
    assert sorted(c[-1]["content"] for c in seen) == ["<answer>42</answer>", "<answer>48</answer>"]
    # The loss mask: the tool result's tokens are out, the policy's tokens of both turns in.
    (inputs,) = losses
    for kept, masked in split_by_tool_mask(tokenizer, inputs):
        assert "<tool_call>" in kept and "<answer>" in kept
        assert "<tool_response>" in masked and re.search(r"4[28]", masked)
        assert "<tool_response>" not in kept
    # TRL's metrics: one tool call per episode, no failures; the reward has spread.
    (log,) = [e for e in trainer.state.log_history if "loss" in e]
    assert log["tools/call_frequency"] == 1.0 and log["tools/failure_frequency"] == 0.0
    assert log["reward"] == 0.5
    # An optimizer step happened and moved the weights.
    after = list(trainer.model.parameters())
    assert any(not torch.equal(b, a.detach()) for b, a in zip(before, after, strict=True))
