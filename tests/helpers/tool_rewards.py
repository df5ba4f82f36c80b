"""The reward of tests/test_tool_episode.py: 1 when the last turn answers 42; keeps what it saw."""

from __future__ import annotations

SEEN: list = []


def answer_is_42(completions, **kwargs):
    SEEN.extend(completions)
    return [1.0 if "<answer>42</answer>" in c[-1]["content"] else 0.0 for c in completions]


def episode_lengths(completions, completion_ids, **kwargs):
    """0 for all; appends each episode's full token count (tool output included) to the file
    named by $TOOL_EPISODE_LENGTHS, one JSON list a call (tests/vllm_server/test_vllm_tools.py)."""
    import json
    import os

    with open(os.environ["TOOL_EPISODE_LENGTHS"], "a") as file:
        file.write(json.dumps([len(ids) for ids in completion_ids]) + "\n")
    return [0.0] * len(completions)
