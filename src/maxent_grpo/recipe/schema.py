"""The recipe key schema: every flag TRL's parser would make, without importing TRL.

    python -m maxent_grpo.recipe.schema --write    # regenerate schema.json (after a change to
                                                   # recipe/*keys.py,
                                                   # recipe/ranges.py or TRL)

Importing TRL, transformers and torch takes seconds; the launcher (plan, sbatch, submit, every
attempt) only needs the keys' names, types, choices, defaults, ranges and packages.
`generate()` derives them from the keys' declarations (recipe/declare.py): the method's
dataclasses through TrlParser (the parser the trainers' sections define; a TRL key's default
is TRL's, read here), with recipe/ranges.py TRL_KEYS and recipe/keys.py's TRL_CONVERTERS and
MAPPING_LISTS, and writes them to schema.json next to this file. `schema_parser(method)`
rebuilds the same argparse parser from it. tests/test_recipe_schema.py fails when the file
differs from a fresh generation.

JSON has no tuples, infinities or enums: values other than None, bool, int, str, finite floats
and lists are stored tagged ({"tuple": [...]}, {"float": "inf"}, {"dict": {...}}); a str enum
is stored as its value (which it equals).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import functools
import json
import math
import sys
import typing
from pathlib import Path
from typing import Any, NoReturn

from maxent_grpo.errors import ConfigError
from maxent_grpo.recipe.converters import (
    CONVERTERS,
    PLAIN_TYPES,
    accept_none,
    choice_type,
    enum_type,
    unsupported_type,
)
from maxent_grpo.recipe.declare import Accepts, declarations

SCHEMA_PATH = Path(__file__).with_name("schema.json")
WRITE_COMMAND = "python -m maxent_grpo.recipe.schema --write"
# The sections of a recipe, in the order of maxent_grpo.recipe.Recipe's fields.
SECTIONS = ("script", "training", "model", "launch")
_ACTION_KINDS = {"_StoreAction": "store", "_StoreFalseAction": "store_false", "_HelpAction": "help"}


class RecipeArgumentParser(argparse.ArgumentParser):
    """argparse with TrlParser's YAML defaults; a bad flag is one line instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        """Raise the one-line ConfigError (argparse would print usage and exit)."""
        raise ConfigError(f"command line: {message}")

    def set_defaults_with_config(self, **values: Any) -> None:
        """TrlParser's: the recipe's values become the defaults (flags override them)."""
        for action in self._actions:
            if action.dest in values:
                action.default = values[action.dest]
                action.required = False


# --- JSON values -------------------------------------------------------------------------------


def encode(value: Any) -> Any:
    """A default (or choice) as JSON; tagged where JSON has no such value."""
    if value is None or isinstance(value, (bool, int, str)) and not isinstance(value, enum.Enum):
        return value
    if isinstance(value, enum.Enum) and isinstance(value, str):
        return value.value  # a str enum equals its value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, list):
        return [encode(item) for item in value]
    if isinstance(value, tuple):
        return {"tuple": [encode(item) for item in value]}
    if isinstance(value, dict):
        return {"dict": {str(key): encode(item) for key, item in value.items()}}
    raise TypeError(f"no JSON form for {value!r} ({type(value).__name__})")


def decode(value: Any) -> Any:
    if isinstance(value, list):
        return [decode(item) for item in value]
    if not isinstance(value, dict):
        return value
    ((tag, inner),) = value.items()
    if tag == "float":
        return float(inner)
    if tag == "tuple":
        return tuple(decode(item) for item in inner)
    return {key: decode(item) for key, item in inner.items()}


# --- generation (imports TRL) ------------------------------------------------------------------


def trl_parser(types: tuple[type, ...]) -> argparse.ArgumentParser:
    """TRL's parser of a method's sections, with TRL_CHOICES and TRL_CONVERTERS applied: what
    the schema describes (and the tests' reference reader)."""
    from trl import TrlParser

    from maxent_grpo.recipe.keys import TRL_CONVERTERS  # imports TRL
    from maxent_grpo.recipe.ranges import TRL_KEYS  # imports transformers

    class RaisingTrlParser(TrlParser):
        error = RecipeArgumentParser.error

    # allow_abbrev=False: argparse would otherwise take --max_step as --max_steps, silently.
    parser = RaisingTrlParser(types, allow_abbrev=False)
    for action in parser._actions:
        if TRL_KEYS.get(action.dest, Accepts()).choices:
            action.choices = TRL_KEYS[action.dest].choices
        if action.dest in TRL_CONVERTERS:
            action.type = TRL_CONVERTERS[action.dest]
    return parser


def _type_spec(convert: Any, action: argparse.Action) -> dict[str, Any]:
    """The action's type as a name the runtime maps back (recipe/converters.py)."""
    if convert is None:
        return {"type": None}
    if getattr(convert, "__qualname__", "").startswith("_accept_none."):
        # TRL wraps the type of a `T | None` key: 'none' / 'null' read as None
        return {**_type_spec(convert.__closure__[0].cell_contents, action), "none": True}
    names = {id(f): name for name, f in {**PLAIN_TYPES, **CONVERTERS}.items()}
    if id(convert) in names:
        return {"type": names[id(convert)]}
    if getattr(convert, "__name__", "") == "string_to_bool":
        return {"type": "bool"}
    if getattr(convert, "__name__", "") == "<lambda>" and action.choices:
        return {"type": "choice"}  # make_choice_type_function: Literal and Enum keys
    if isinstance(convert, type) and issubclass(convert, enum.Enum):
        return {"type": "enum", "type_name": convert.__name__, "values": [m.value for m in convert]}
    if action.dest in _trl_converters():
        raise TypeError(
            f"converter of {action.dest!r}: add it to recipe/converters.py CONVERTERS and name it "
            "in recipe/keys.py TRL_CONVERTERS"
        )
    return {"type": "unsupported", "type_name": getattr(convert, "__name__", repr(convert))}


def _trl_converters() -> dict[str, Any]:
    from maxent_grpo.recipe.keys import TRL_CONVERTERS  # imports TRL

    return TRL_CONVERTERS


def _action_spec(action: argparse.Action) -> dict[str, Any]:
    spec = {
        "dest": action.dest,
        "options": list(action.option_strings),
        "action": _ACTION_KINDS[type(action).__name__],
    }
    if spec["action"] == "store_false":  # --no_x: its default (False) is never read
        return {**spec, "default": encode(action.default)}
    if spec["action"] == "help":
        return spec
    try:
        default = encode(action.default)
    except TypeError as exc:
        raise TypeError(f"default of {action.dest!r}: {exc}") from None
    return {
        **spec,
        **_type_spec(action.type, action),
        "nargs": action.nargs,
        "const": encode(action.const),
        "default": default,
        "choices": None if action.choices is None else [encode(c) for c in action.choices],
        "required": action.required,
    }


def _key_specs(types: tuple[type, ...]) -> dict[str, dict[str, Any]]:
    """Per key: its section, and whether its field's type admits a list or a dict (argparse
    knows one scalar type per flag; YAML can carry the richer value, e.g. report_to)."""
    keys = {}
    for section, dataclass_type in zip(SECTIONS, types, strict=True):
        for name, hint in typing.get_type_hints(dataclass_type).items():
            accepts = [c for c in ("list", "dict") if c in str(hint)]
            keys.setdefault(name, {"section": section, "accepts": accepts})
    return keys


def key_declarations() -> dict[str, Accepts]:
    """Every key's declared range, choices (TRL keys) and packages, over every method's
    sections and recipe/ranges.py TRL_KEYS (imports TRL)."""
    from maxent_grpo.recipe.ranges import TRL_KEYS  # imports transformers
    from maxent_grpo.recipe.sections import SECTIONS  # imports TRL

    sections = dict.fromkeys(s for types in SECTIONS.values() for s in types)
    return declarations(sections, TRL_KEYS)


def generate() -> dict[str, Any]:
    """The schema of every method, derived from the dataclasses (imports TRL: seconds)."""
    import transformers
    import trl

    from maxent_grpo.recipe.keys import MAPPING_LISTS  # imports TRL
    from maxent_grpo.recipe.sections import SECTIONS  # imports TRL

    declared = key_declarations()
    methods = {}
    for name, types in SECTIONS.items():
        actions = [_action_spec(action) for action in trl_parser(types)._actions]
        dests = {a["dest"] for a in actions}
        keys = {k: v for k, v in _key_specs(types).items() if k in dests}
        methods[name] = {"keys": keys, "actions": actions}
    return {
        "regenerate": WRITE_COMMAND,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__},
        "mapping_lists": sorted(MAPPING_LISTS),
        "ranges": {k: list(a.range) for k, a in sorted(declared.items()) if a.range},
        "packages": {
            k: [dataclasses.asdict(p) for p in a.packages]
            for k, a in sorted(declared.items())
            if a.packages
        },
        "methods": methods,
    }


def render(schema: dict[str, Any]) -> str:
    """JSON with one key or action per line (readable diffs when a key changes)."""

    def line(value: Any) -> str:
        return json.dumps(value, allow_nan=False)

    out = ["{"]
    for name in ("regenerate", "versions", "mapping_lists", "ranges", "packages"):
        out.append(f" {line(name)}: {line(schema[name])},")
    out.append(' "methods": {')
    for i, (method, spec) in enumerate(schema["methods"].items()):
        keys = [f"   {line(k)}: {line(v)}" for k, v in spec["keys"].items()]
        actions = [f"   {line(a)}" for a in spec["actions"]]
        out += [f"  {line(method)}: {{", '  "keys": {', ",\n".join(keys), "  },"]
        out += ['  "actions": [', ",\n".join(actions), "  ]"]
        out.append("  }" + ("," if i + 1 < len(schema["methods"]) else ""))
    out += [" }", "}"]
    return "\n".join(out) + "\n"


# --- use (no TRL) ------------------------------------------------------------------------------


@functools.cache
def load() -> dict[str, Any]:
    """The committed schema."""
    return json.loads(SCHEMA_PATH.read_text())


def method_keys(method: str) -> dict[str, dict[str, Any]]:
    """Per key of `method`: {"section": ..., "accepts": ["list", "dict"]}."""
    return load()["methods"][method]["keys"]


def ranges() -> dict[str, tuple]:
    """Every declared range: key -> (operator, bound) or (operator, bound, operator, bound)."""
    return {key: tuple(rule) for key, rule in load()["ranges"].items()}


def default(key: str, method: str = "grpo") -> Any:
    """A key's default, as the recipe parser gives it (TRL's own for a TRL key)."""
    for spec in load()["methods"][method]["actions"]:
        if spec["dest"] == key and spec["action"] == "store":
            return decode(spec["default"])
    raise KeyError(key)


def _converter(spec: dict[str, Any], choices: list[Any] | None):
    kind = spec["type"]
    if kind is None:
        return None
    if kind == "choice":
        convert = choice_type(choices)
    elif kind == "enum":
        convert = enum_type(spec["type_name"], spec["values"])
    elif kind == "unsupported":
        convert = unsupported_type(spec["type_name"])
    else:
        convert = PLAIN_TYPES.get(kind) or CONVERTERS[kind]
    return accept_none(convert) if spec.get("none") else convert


def schema_parser(method: str) -> RecipeArgumentParser:
    """The argparse parser of a method's keys, as TrlParser builds it (without importing it)."""
    parser = RecipeArgumentParser(allow_abbrev=False)
    for spec in load()["methods"][method]["actions"]:
        if spec["action"] == "help":
            continue  # argparse adds its own
        if spec["action"] == "store_false":
            parser.add_argument(
                *spec["options"], action="store_false", dest=spec["dest"], default=spec["default"]
            )
            continue
        choices = None if spec["choices"] is None else decode(spec["choices"])
        kwargs = {"type": _converter(spec, choices), "default": decode(spec["default"])}
        if spec["nargs"] is not None:
            kwargs["nargs"] = spec["nargs"]
        if spec["nargs"] == "?":
            kwargs["const"] = decode(spec["const"])
        parser.add_argument(
            *spec["options"],
            dest=spec["dest"],
            choices=choices,
            required=spec["required"],
            **kwargs,
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the recipe key schema (schema.json)")
    parser.add_argument("--write", action="store_true", help="regenerate schema.json")
    args = parser.parse_args(argv)
    text = render(generate())
    if args.write:
        SCHEMA_PATH.write_text(text)
        print(f"wrote {SCHEMA_PATH}")
        return 0
    if SCHEMA_PATH.read_text() != text:
        print(f"{SCHEMA_PATH} is out of date; run: {WRITE_COMMAND}", file=sys.stderr)
        return 1
    print(f"{SCHEMA_PATH} is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
