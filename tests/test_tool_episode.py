"""A tool-using episode of two turns through our GRPO trainer on CPU: generation, TRL's
tool-calling loop with the sandboxed `python` tool, the loss mask, the reward, an optimizer step.

What stands in for what: the tiny random model would never write a tool call, so its sampling
is scripted. Its own `generate` runs (real forward passes), constrained by transformers'
`prefix_allowed_tokens_fn` to the tokens of a script: turn 1 writes a Qwen2.5-style
`<tool_call>` running `print(6*7)` (or `print(6*8)` on odd rows, so the group's rewards
differ), turn 2 answers with the number the tool returned. Everything else is the real path:
TRL parses the call with the Qwen2.5 response schema, our sandbox runs the program, TRL
appends the result, generates again and builds the tool mask; the trainer scores, computes
the loss and steps the optimizer.
"""

from __future__ import annotations

import functools
import re

import pytest
import torch

from helpers.recipes import small_recipe

pytestmark = pytest.mark.integration

CALL = '<tool_call>\n{{"name": "python", "arguments": {{"code": "print(6*{n})"}}}}\n</tool_call>'


def _qwen25_template() -> str:
    from importlib.resources import files

    return (files("trl") / "chat_templates" / "qwen2_5.jinja").read_text()


def _scripted(generate, tokenizer, prompt_lengths: list[int]):
    """The model's generate, constrained to the script of each row's turn."""

    @functools.wraps(generate)
    def scripted(*args, **kwargs):
        input_ids = kwargs["input_ids"]
        width = input_ids.shape[1]
        prompt_lengths.append(width)
        scripts = []
        for row in range(input_ids.shape[0]):
            seen = tokenizer.decode(input_ids[row])
            tool_out = re.findall(r"<tool_response>\s*(\S+)\s*</tool_response>", seen)
            text = f"<answer>{tool_out[-1]}</answer>" if tool_out else CALL.format(n=7 + row % 2)
            scripts.append(tokenizer.encode(text + tokenizer.eos_token))

        def allowed(row: int, sent: torch.Tensor) -> list[int]:
            step = sent.shape[0] - width
            script = scripts[row]
            return [script[step] if step < len(script) else tokenizer.eos_token_id]

        return generate(*args, prefix_allowed_tokens_fn=allowed, **kwargs)

    return scripted


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
        chat_template=_qwen25_template(),
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
    widths: list[int] = []
    trainer.model.generate = _scripted(trainer.model.generate, tokenizer, widths)
    losses: list[dict] = []
    compute_loss = trainer.compute_loss

    def recording(model, inputs, *a, **k):
        losses.append({k: v.detach().clone() for k, v in inputs.items() if torch.is_tensor(v)})
        return compute_loss(model, inputs, *a, **k)

    trainer.compute_loss = recording
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
    for ids, tool_mask, mask in zip(
        inputs["completion_ids"], inputs["tool_mask"], inputs["completion_mask"], strict=True
    ):
        kept = ids[(mask * tool_mask).bool()]
        masked = ids[(mask * (1 - tool_mask)).bool()]
        assert "<tool_call>" in tokenizer.decode(kept) and "<answer>" in tokenizer.decode(kept)
        assert "<tool_response>" in tokenizer.decode(masked)
        assert re.search(r"4[28]", tokenizer.decode(masked))
        assert "<tool_response>" not in tokenizer.decode(kept)
    # TRL's metrics: one tool call per episode, no failures; the reward has spread.
    (log,) = [e for e in trainer.state.log_history if "loss" in e]
    assert log["tools/call_frequency"] == 1.0 and log["tools/failure_frequency"] == 0.0
    assert log["reward"] == 0.5
    # An optimizer step happened and moved the weights.
    after = list(trainer.model.parameters())
    assert any(not torch.equal(b, a.detach()) for b, a in zip(before, after, strict=True))
