"""The value converters of recipe keys, by name: what the schema's `type` of a key means.

The launcher parses recipes without importing TRL or transformers (recipe/schema.py), so the
converters HfArgumentParser would give a flag live here, as plain functions, under the names
the committed schema uses. Each behaves as the one it stands for; tests/test_recipe_schema.py
compares the two readers on every recipe.
"""

from __future__ import annotations

from argparse import ArgumentTypeError
from collections.abc import Callable, Sequence
from typing import Any


def string_to_bool(value: Any) -> bool:
    """transformers.hf_argparser.string_to_bool: the type of every bool key."""
    if isinstance(value, bool):
        return value
    if value.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if value.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise ArgumentTypeError(
        f"Truthy value expected: got {value} but expected one of yes/no, true/false, t/f, y/n, "
        "1/0 (case insensitive)."
    )


def scale_rewards(value: str) -> str:
    """TRL's scale_rewards is a str field that also means true/false (group / none); its own
    mapping only sees Python bools, so a recipe's `false` would reach the trainer as 'False'."""
    named = {"true": "group", "false": "none"}.get(value.strip().lower(), value.strip().lower())
    if named not in ("group", "batch", "none"):
        raise ValueError("expected one of group, batch, none (or true = group, false = none)")
    return named


def accept_none(inner: Callable[[str], Any]) -> Callable[[str], Any]:
    """TRL's _accept_none: a `T | None` key (T not str) reads 'none' / 'null' as None."""

    def parse(text: str) -> Any:
        if text.lower() in ("none", "null"):
            return None
        return inner(text)

    parse.__name__ = getattr(inner, "__name__", "value")  # argparse's messages name the type
    return parse


def choice_type(choices: Sequence[Any]) -> Callable[[str], Any]:
    """transformers' make_choice_type_function: Literal and Enum keys (the choices are checked
    by argparse)."""
    by_text = {str(choice): choice for choice in choices}
    return lambda text: by_text.get(text, text)


def enum_type(name: str, values: Sequence[str]) -> Callable[[str], str]:
    """A list of a transformers ExplicitEnum (e.g. `debug`): its value, or its error message."""

    def convert(text: str) -> str:
        if text not in values:
            raise ValueError(f"{text} is not a valid {name}, please select one of {list(values)}")
        return text

    convert.__name__ = name  # the parser's "expected <type>" names it
    return convert


def unsupported_type(name: str) -> Callable[[str], Any]:
    """A key whose type no recipe can spell (e.g. accelerate's ParallelismConfig)."""

    def convert(text: str) -> Any:
        raise ValueError(f"a {name} cannot be given in a recipe")

    convert.__name__ = name
    return convert


# Converters of TRL-owned keys whose field type cannot parse what TRL accepts (recipe/keys.py
# TRL_CONVERTERS names these; the schema stores the name).
CONVERTERS: dict[str, Callable[[str], Any]] = {"scale_rewards": scale_rewards}

# The plain types of the schema, by name.
PLAIN_TYPES: dict[str, Callable[[Any], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "dict": dict,
    "bool": string_to_bool,
}
