"""Whether every generation request of a rollout fits the vLLM server's context
(vllm_max_model_length), checked before any GPU time (preflight.check_context calls
fits_context).

What TRL 1.16 asks of the server (trl/trainer/grpo_trainer.py, vllm_generation.py): each
request is a prompt plus max_tokens = max_completion_length, and the server answers HTTP 400
when the two pass its --max-model-len, which ends the run. A single-turn rollout asks for
prompt + max_completion_length. In the tool loop a turn after a tool call sends prompt +
episode so far (TRL keeps the episode within max_completion_length: a longer tool result is
dropped) and again asks for max_completion_length: up to prompt + 2 x max_completion_length.
The prompt is the tokenized chat prompt with the tools' schemas, as TRL tokenizes it.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from maxent_grpo.rewards.common import RewardError
from maxent_grpo.rewards.environments import tool_methods


def schema_tools(tools: list[Callable], environment: type | None) -> list[Callable]:
    """The callables whose schemas TRL renders into each prompt: the recipe's tools and the
    environment's tool methods (bound, as TRL binds them to an instance: no `self`)."""
    methods = tool_methods(environment) if environment is not None else {}
    return [*tools, *(types.MethodType(fn, object()) for fn in methods.values())]


def longest_prompt(prompts: Iterable[Any], tokenizer, tools: list[Callable]) -> int:
    """Tokens of the longest prompt: chat prompts through the chat template with the tools'
    schemas and the generation prompt (TRL's _tokenize_prompts), text prompts as they are."""
    longest = 0
    for prompt in prompts:
        if isinstance(prompt, list):
            out = tokenizer.apply_chat_template(
                [prompt], tools=tools or None, add_generation_prompt=True, tokenize=True
            )
            ids = out["input_ids"][0] if isinstance(out, Mapping) else out[0]
        else:
            ids = tokenizer(text=prompt)["input_ids"]
        longest = max(longest, len(ids))
    return longest


def fits_context(limit: int, completion: int, multi_turn: bool, prompt: int, how: str) -> None:
    """Refuse a recipe whose longest request passes the server's context, in one line.
    prompt: the longest prompt in tokens (0 when not measured); how: how it was found."""
    turns = 2 if multi_turn else 1
    need = prompt + turns * completion
    if need <= limit:
        return
    what = f"max_completion_length ({completion})"
    if multi_turn:
        what = f"2 x max_completion_length (2 x {completion}: a turn after a tool call asks "
        what += "for it again)"
    raise RewardError(
        f"vllm_max_model_length: {limit} but the longest prompt ({prompt} tokens, {how}) + "
        f"{what} = {need} tokens; the vLLM server answers HTTP 400 past it and the run stops; "
        f"raise vllm_max_model_length to {need} or more, or lower max_completion_length"
    )
