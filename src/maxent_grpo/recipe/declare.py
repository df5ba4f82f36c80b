"""What a recipe key accepts beyond its type: its range and the optional package it needs.

Each key is declared once. Our keys are dataclass fields (recipe/*_keys.py, recipe/keys.py):
name, type, default, help and `choices` in the field, and the rest in the field's type,
`Annotated[float, Accepts(range=(">", 0))]`. TRL's and transformers' keys are declared by
their libraries (name, type, default, help); what we add to them is one `Accepts` each in
recipe/ranges.py TRL_KEYS. Everything else is derived from these declarations
(`declarations`): the ranges and packages in schema.json, the parser's choices of TRL keys,
the launcher's TRL-free defaults (launch/requirements.py reads schema.json) and the docs
reference. tests/test_key_declarations.py checks that every derived view agrees.

Annotated extras are invisible to TrlParser (transformers reads `get_type_hints` without
extras), so a declaration here never changes how TRL parses the key. Standard library only.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from maxent_grpo.errors import ConfigError

_OPERATORS = {
    ">": (lambda v, b: v > b),
    ">=": (lambda v, b: v >= b),
    "<": (lambda v, b: v < b),
    "<=": (lambda v, b: v <= b),
}


@dataclass(frozen=True)
class Package:
    """An optional package a key's value asks for: its import name and the extra installing it."""

    module: str
    extra: str
    when: str  # the value that asks for it, in words (docs)


@dataclass(frozen=True)
class Accepts:
    """What a key accepts beyond its type.

    range: (operator, bound) or (operator, bound, operator, bound) for an interval; None (unset)
    is never out of range. choices: TRL keys only (ours carry them in field metadata, where
    argparse reads them). source: for a TRL or transformers key, the library code that refuses
    (or silently misuses) a value outside, often only once the model is loaded.
    """

    range: tuple = ()
    choices: tuple[str, ...] = ()
    packages: tuple[Package, ...] = ()
    source: str = ""

    def __post_init__(self):
        ops = self.range[::2]
        if len(self.range) not in (0, 2, 4) or not set(ops) <= set(_OPERATORS):
            raise ValueError(f"range {self.range!r}: (op, bound) or (op, bound, op, bound)")


def pairs(rule: Iterable) -> tuple[tuple[str, float], ...]:
    """(">", 0, "<=", 1) -> ((">", 0), ("<=", 1))."""
    rule = tuple(rule)
    return tuple(zip(rule[::2], rule[1::2], strict=True))


def describe(rule: Iterable) -> str:
    """A range in words: '> 0 and <= 1'."""
    return " and ".join(f"{op} {_number(bound)}" for op, bound in pairs(rule))


def _number(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def in_range(value: Any, rule: Iterable) -> bool:
    """Whether a set value lies in the range (the one implementation of a range check)."""
    return all(_OPERATORS[op](value, bound) for op, bound in pairs(rule))


@functools.cache
def own_declarations(section: type) -> dict[str, Accepts]:
    """The Accepts of a dataclass's fields, from their Annotated types (ours only)."""
    hints = typing.get_type_hints(section, include_extras=True)
    found = {}
    for f in fields(section):
        extras = getattr(hints.get(f.name), "__metadata__", ())
        accepts = [extra for extra in extras if isinstance(extra, Accepts)]
        if accepts:
            found[f.name] = accepts[0]
    return found


def declarations(sections: Iterable[type], library_keys: dict[str, Accepts]) -> dict[str, Accepts]:
    """Every key's Accepts: ours from the sections' fields, TRL's from `library_keys`.

    A key declared in both places has two homes: refused.
    """
    found: dict[str, Accepts] = {}
    for section in sections:
        found.update(own_declarations(section))
    both = sorted(set(found) & set(library_keys))
    if both:
        raise ValueError(f"declared in a field and in TRL_KEYS: {both}; keep one")
    return {**found, **library_keys}


def check_own_ranges(config: Any) -> None:
    """A section's own declared ranges (its `__post_init__`), for a section built directly
    (the recipe parser checks every declared range when it reads a recipe)."""
    for name, accepts in own_declarations(type(config)).items():
        value = getattr(config, name)
        if accepts.range and value is not None and not in_range(value, accepts.range):
            want = describe(accepts.range)
            raise ConfigError(f"{name}: {value!r} is invalid (must be {want}); set {name} {want}")
