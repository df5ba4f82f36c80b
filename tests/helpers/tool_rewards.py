"""The reward of tests/test_tool_episode.py: 1 when the last turn answers 42; keeps what it saw."""

from __future__ import annotations

SEEN: list = []


def answer_is_42(completions, **kwargs):
    SEEN.extend(completions)
    return [1.0 if "<answer>42</answer>" in c[-1]["content"] else 0.0 for c in completions]
