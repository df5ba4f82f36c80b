"""A scripted tool-using policy for the tool episode tests (imported as `helpers.scripted_policy`).

The tiny random model would never write a tool call, so its sampling is scripted: its own
`generate` runs (real forward passes), constrained by transformers' `prefix_allowed_tokens_fn`
to the tokens of a script. Turn 1 writes a Qwen2.5-style `<tool_call>` (the call of `calls`,
row by row: odd rows differ, so a group's rewards differ), the turn after a tool result answers
with the last tool result. Everything else is the real path: TRL parses the call with the
Qwen2.5 response schema, runs the tool, appends the result, generates again and builds the
tool mask; the trainer scores, computes the loss and steps the optimizer.
"""

from __future__ import annotations

import functools
import json
import re

import torch

# The Python tool's calls of rows 0 and 1 (print 42, print 48).
PYTHON_CALLS = (
    {"name": "python", "arguments": {"code": "print(6*7)"}},
    {"name": "python", "arguments": {"code": "print(6*8)"}},
)


def qwen25_template() -> str:
    """TRL's Qwen2.5 chat template: renders tool calls, and TRL knows how to parse them."""
    from importlib.resources import files

    return (files("trl") / "chat_templates" / "qwen2_5.jinja").read_text()


def script_of(seen: str, row: int, calls=PYTHON_CALLS) -> str:
    """The text a row writes next, given everything it has seen so far."""
    tool_out = re.findall(r"<tool_response>\s*(\S+)\s*</tool_response>", seen)
    if tool_out:
        return f"<answer>{tool_out[-1]}</answer>"
    return f"<tool_call>\n{json.dumps(calls[row % len(calls)])}\n</tool_call>"


def script_generate(model, tokenizer, calls=PYTHON_CALLS) -> list[int]:
    """Hold `model.generate` to the script; returns the list of each call's prompt width."""
    generate = model.generate
    widths: list[int] = []

    @functools.wraps(generate)
    def scripted(*args, **kwargs):
        input_ids = kwargs["input_ids"]
        width = input_ids.shape[1]
        widths.append(width)
        scripts = [
            tokenizer.encode(
                script_of(tokenizer.decode(input_ids[row]), row, calls) + tokenizer.eos_token
            )
            for row in range(input_ids.shape[0])
        ]

        def allowed(row: int, sent: torch.Tensor) -> list[int]:
            step = sent.shape[0] - width
            script = scripts[row]
            return [script[step] if step < len(script) else tokenizer.eos_token_id]

        return generate(*args, prefix_allowed_tokens_fn=allowed, **kwargs)

    model.generate = scripted
    return widths


def record_loss_inputs(trainer) -> list[dict]:
    """The tensors of every compute_loss call (a copy), in order."""
    seen: list[dict] = []
    compute_loss = trainer.compute_loss

    def recording(model, inputs, *a, **k):
        seen.append({k: v.detach().clone() for k, v in inputs.items() if torch.is_tensor(v)})
        return compute_loss(model, inputs, *a, **k)

    trainer.compute_loss = recording
    return seen


def split_by_tool_mask(tokenizer, inputs: dict) -> list[tuple[str, str]]:
    """Per completion: (the text the loss sees, the text masked out as tool output)."""
    pairs = []
    for ids, tool_mask, mask in zip(
        inputs["completion_ids"], inputs["tool_mask"], inputs["completion_mask"], strict=True
    ):
        kept = ids[(mask * tool_mask).bool()]
        masked = ids[(mask * (1 - tool_mask)).bool()]
        pairs.append((tokenizer.decode(kept), tokenizer.decode(masked)))
    return pairs
