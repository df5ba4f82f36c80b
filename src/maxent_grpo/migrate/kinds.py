"""The kinds of rows of the migration table: what to do with a key, a default, a value.

Rows are written with keywords, one origin at a time:

    UP = Rows("upstream maxent-grpo")
    UP.rename("gen_top_p", to="top_p", why="TRL's nucleus sampling")
    UP.remove("reward_clip", why="rewards are not clipped here", changes=is_set)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Migration:
    """What to do with one key the parser does not know (or knows under another name).

    action: "rename" (same value, new key), "convert" (new key, value converted by `convert`,
    which raises ValueError when the value has no counterpart), "alias" (accepted as is,
    read as `target`), "remove" (no counterpart: delete it, `why` says what to do instead),
    "fold" (migrate folds it with related keys into `target`: migrate/rules.py).
    changes: whether the recipe's value, left out, changes training (None: never; a
    "behaviour difference" in migrate's summary).
    """

    key: str
    action: str
    origin: str  # who removed or renamed it: "transformers 5", "TRL 1.16", "open-r1", upstream
    why: str  # what changed and what to do, one clause (no trailing period)
    target: str | None = None
    convert: Callable[[Any], Any] | None = None
    changes: Callable[[Any], bool] | None = None


Changes = Callable[[Any], bool] | None


@dataclass(frozen=True)
class Rows:
    """The rows of one origin, each written with keywords."""

    origin: str

    def rename(self, key: str, *, to: str, why: str, changes: Changes = None) -> Migration:
        return Migration(key, "rename", self.origin, why, to, None, changes)

    def convert(
        self, key: str, *, to: str, by: Callable[[Any], Any], why: str, changes: Changes = None
    ) -> Migration:
        return Migration(key, "convert", self.origin, why, to, by, changes)

    def alias(self, key: str, *, to: str, why: str) -> Migration:
        return Migration(key, "alias", self.origin, why, to)

    def remove(self, key: str, *, why: str, changes: Changes = None) -> Migration:
        return Migration(key, "remove", self.origin, why, None, None, changes)

    def fold(self, key: str, *, into: str, why: str) -> Migration:
        return Migration(key, "fold", self.origin, why, into)


@dataclass(frozen=True)
class DefaultChange:
    """A key whose default differs between open-r1's TRL and here: migrate writes it out."""

    key: str
    value: Any  # what open-r1 meant when the key was absent
    when: str  # the condition, in words (docs)
    why: str
    applies: Callable[[dict[str, Any]], bool]


#: ValueChange.replace's answer when the key has to go.
REMOVE = object()


@dataclass(frozen=True)
class ValueChange:
    """A value with no counterpart here: migrate replaces it (or leaves the key out: REMOVE)."""

    key: str
    values: str  # which values, in words (docs)
    instead: str  # what is written instead, in words (docs)
    why: str
    matches: Callable[[Any], bool]
    replace: Callable[[Any], Any]
    changes: bool = False  # the replacement trains differently (migrate's summary lists it)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
