"""What every reward shares: the calling convention's types, its error, and completion text."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from maxent_grpo.errors import UserError

RewardFunc = Callable[..., list[float | None]]


class RewardError(UserError):
    """A reward name, ``module:function`` spec, setting or input that cannot be used."""


class RewardUnavailable(Exception):
    """A reward that cannot score at all (its server is down): the run stops with this line,
    since retrying sample by sample (guard.py) cannot help."""


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # multimodal content parts
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


def completion_text(completion: Any) -> str:
    """Text of one completion: a string, or the content of the last message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return _content_text(completion.get("content"))
    if isinstance(completion, Sequence):
        if not completion:
            return ""
        last = completion[-1]
        if isinstance(last, Mapping):
            return _content_text(last.get("content"))
        return _content_text(last)
    if completion is None:
        return ""
    return str(completion)


def contents(completions: Sequence[Any]) -> list[str]:
    """The text of every completion."""
    return [completion_text(c) for c in completions]


def column(name: str, key: str, value: Any, count: int, needs: str) -> list[Any]:
    """A per-completion keyword (dataset column) as a list aligned with the completions.

    ``needs`` says where the column comes from, for the error when it is missing.
    """
    if value is None:
        raise RewardError(f"reward {name!r} needs {needs} as the {key!r} keyword")
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise RewardError(
            f"reward {name!r} needs {key!r} as a list aligned with the completions, "
            f"got {type(value).__name__}"
        )
    if len(value) != count:
        raise RewardError(f"reward {name!r} got {count} completions but {len(value)} {key}s")
    return list(value)


def references(name: str, solution: Any, count: int) -> list[Any]:
    """The reference answers (the ``solution`` keyword), one per completion."""
    return column(name, "solution", solution, count, "the reference answers (a 'solution' column)")
