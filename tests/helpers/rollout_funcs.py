"""Rollout functions and a scripted policy for tests/test_rollout_func.py
(imported as `helpers.rollout_funcs`).

The tiny random model would almost never end an answer (EOS) within a few tokens, so its
sampling is scripted as in helpers/scripted_policy.py: its own `generate` runs, held by
`prefix_allowed_tokens_fn` to a script. Turn 1 answers `<answer>7</answer>` on even rows and
`<answer>x</answer>` on odd ones (a group's rewards differ); after the self-check text it
writes ` checked`.
"""

from __future__ import annotations

import functools

import torch

from maxent_grpo.train.rollout_func import CHECK_TEXT, self_check

CALLS: list[dict] = []  # each call of recording_self_check: its prompts and what it returned
SCORED: list[list] = []  # each call of seven: the self_checked field it was given


def recording_self_check(prompts, trainer) -> dict:
    output = self_check(prompts, trainer)
    CALLS.append({"prompts": list(prompts), "output": output})
    return output


def seven(completions, self_checked=None, **kwargs) -> list[float]:
    """1.0 for a completion that answered 7."""
    SCORED.append(list(self_checked) if self_checked is not None else None)
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float("<answer>7</answer>" in text) for text in texts]


def wrong_signature(prompts) -> dict:
    return {}


def script_of(seen: str, row: int) -> str:
    if CHECK_TEXT in seen:
        return " checked"
    return "<answer>7</answer>" if row % 2 == 0 else "<answer>x</answer>"


def script_generate(model, tokenizer) -> None:
    """Hold `model.generate` to script_of, row by row."""
    generate = model.generate

    @functools.wraps(generate)
    def scripted(*args, **kwargs):
        input_ids = kwargs["input_ids"]
        width = input_ids.shape[1]
        scripts = [
            tokenizer.encode(script_of(tokenizer.decode(input_ids[row]), row))
            + [tokenizer.eos_token_id]
            for row in range(input_ids.shape[0])
        ]

        def allowed(row: int, sent: torch.Tensor) -> list[int]:
            step = sent.shape[0] - width
            script = scripts[row]
            return [script[step] if step < len(script) else tokenizer.eos_token_id]

        return generate(*args, prefix_allowed_tokens_fn=allowed, **kwargs)

    model.generate = scripted


def was_checked(completions, self_checked, **kwargs) -> list[float]:
    """Weight 0 in a recipe: logs the share of completions self_check checked
    (rewards/was_checked/mean)."""
    return [float(flag) for flag in self_checked]
