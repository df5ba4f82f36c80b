"""Recipe file + command-line flags -> RecipeKeys: one parse, names, types and choices checked.

TrlParser semantics: YAML values become defaults and command-line flags override them. Every
key and value is checked first, so a typo is one line naming the file, the key and the fix
instead of a traceback an hour into a job; every problem of the file is found in the same pass
(recipe/problems.py). A key that transformers 5, TRL 1.16 or open-r1 named differently gets the
line of the migration table (recipe/old_keys.py, written from maxent_grpo/migrate/, which
the parser never imports); an alias there is read under our name.
YAML values are coerced the way the command line would convert them (YAML 1.1 reads 1e-5 as a
string, for instance).

Three top-level keys are not dataclass fields: `method` (grpo | maxent: which sections and
trainer), `env` (environment variables for the run's processes, carried, never exported
here) and `sweep` (a grid for `maxent-grpo sweep`, recipe/sweep_section.py).
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from maxent_grpo.errors import ConfigError
from maxent_grpo.methods import METHODS, resolve_method
from maxent_grpo.recipe.checks import check_ranges
from maxent_grpo.recipe.old_keys import aliases, old_keys
from maxent_grpo.recipe.problems import Problems, collecting
from maxent_grpo.recipe.schema import method_keys, schema_parser
from maxent_grpo.recipe.sweep_section import SECTION as SWEEP
from maxent_grpo.recipe.sweep_section import SweepSection, check_values, read_section


@dataclass(frozen=True)
class RecipeKeys:
    """Every key's value after the one parse of a recipe (file, then flags).

    Read a key as an attribute (`keys.vllm_server_timeout`): its value from the recipe, the
    flags or the field's one default. The typed sections are built from these values for a
    number of training processes by `maxent_grpo.recipe.build_recipe`.
    """

    path: str  # the recipe file, or "command line"
    method: str  # a name of maxent_grpo.methods.METHODS
    values: Mapping[str, Any]
    env: Mapping[str, str]  # the recipe's `env:` block: for the run's processes, not for us
    overrides: tuple[str, ...] = ()  # the flags after the recipe file, as given
    notes: tuple[str, ...] = ()  # `note:` lines for check: aliases read, then what checks add
    sweep: SweepSection | None = None  # the recipe's `sweep:` section (maxent-grpo sweep)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "values":
            raise AttributeError(name)
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(f"recipe has no key {name!r}") from None

    @property
    def launch(self) -> SimpleNamespace:
        """The launcher's keys (LauncherKeys), read as on a built Recipe (keys.launch.x)."""
        keys = method_keys(self.method)
        return SimpleNamespace(
            **{k: v for k, v in self.values.items() if keys.get(k, {}).get("section") == "launch"}
        )

    def with_values(self, **changes: Any) -> RecipeKeys:
        """The same recipe with some values changed (tests, planning what-ifs), their ranges
        checked as read_recipe checks them (build_recipe does not check them again)."""
        unknown = set(changes) - set(self.values)
        if unknown:
            raise KeyError(f"not recipe keys: {sorted(unknown)}")
        keys = replace(self, values={**self.values, **changes})
        check_ranges(keys)
        return keys


def _closest(key: str, valid: list[str]) -> str:
    matches = difflib.get_close_matches(key, valid, n=3, cutoff=0.6)
    if not matches:
        return "see the recipe key reference in the docs"
    return "did you mean " + " or ".join(repr(m) for m in matches) + "?"


def unknown_key_problem(path: str, key: str, value: Any, valid: list[str]) -> str:
    """The line for a key the parser does not know: the migration table's, else the closest."""
    migration = old_keys().get(key)
    if migration is None:
        return f"{path}: unknown key '{key}'; {_closest(str(key), valid)}"
    return (
        f"{path}: key '{key}' ({migration.origin}): {migration.why}; {migration.fix(value)} "
        "(`maxent-grpo migrate` does it)"
    )


def other_method_problem(path: str, key: str, method: str) -> str | None:
    """The line for a key of another method only (reward_funcs in an SFT recipe), or None."""
    owners = [m for m in METHODS if m != method and key in method_keys(m)]
    if not owners:
        return None
    return (
        f"{path}: key '{key}' belongs to method {' and '.join(owners)}, and this recipe's "
        f"method is {method}, which does not use it; remove {key} or set method: {owners[0]}"
    )


def load_recipe_file(path: str) -> dict[str, Any]:
    """Read a recipe YAML into a dict, with one-line errors for a missing or malformed file."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: recipe file not found; check the --config path") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read recipe: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}:{where}: invalid YAML: {problem}; fix the syntax") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: a recipe must be a YAML mapping of key: value, got {type(raw).__name__}"
        )
    return raw


def _actions_by_dest(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    actions = {}
    for action in parser._actions:
        # store_false actions (--no_x) share the dest; keep the real one
        if action.dest not in actions or action.type is not None:
            actions[action.dest] = action
    return actions


def _type_name(action: argparse.Action) -> str:
    if action.choices:
        return "one of " + ", ".join(str(c) for c in action.choices)
    name = getattr(action.type, "__name__", "value")
    return {"string_to_bool": "true/false"}.get(name, name)


def _coerce(action: argparse.Action, value: Any) -> Any:
    """Convert a YAML value the way the command line would, or raise ValueError."""
    if value is None:
        return value
    if action.nargs in ("+", "*"):
        items = value if isinstance(value, list) else [value]
        return [_coerce_scalar(action, item) for item in items]
    if isinstance(value, list):
        raise ValueError("expected a single value, got a list")
    return _coerce_scalar(action, value)


def _coerce_scalar(action: argparse.Action, value: Any) -> Any:
    if isinstance(value, (list, dict)):
        raise ValueError(f"expected {_type_name(action)}, got a {type(value).__name__}")
    convert = action.type
    if convert is dict:
        raise ValueError("expected a mapping")
    if isinstance(value, bool) and convert in (int, float):
        raise ValueError(f"expected {_type_name(action)}, got {value}")
    text = value if isinstance(value, str) else str(value)
    converted = text if convert is None or convert is str else convert(text)
    if action.choices and converted not in action.choices:
        raise ValueError(f"expected {_type_name(action)}")
    return converted


def _containers(method: str) -> dict[str, set[str]]:
    """Keys whose field type admits a list or a dict (e.g. report_to: str | list[str]): argparse
    knows one scalar type per flag; YAML can carry the richer value directly."""
    from maxent_grpo.recipe import schema  # not at import: `python -m ...schema` runs it

    keys = schema.method_keys(method)
    containers = {
        c: {k for k, spec in keys.items() if c in spec["accepts"]} for c in ("list", "dict")
    }
    containers["mapping_items"] = set(schema.load()["mapping_lists"])
    return containers


def _convert_value(
    key: str, value: Any, action: argparse.Action, path: str, containers: dict[str, set[str]]
) -> Any:
    """One YAML value as its key's type, or a one-line ConfigError."""
    if isinstance(value, list) and key in containers["list"] and action.nargs not in ("+", "*"):
        for item in value if action.choices else ():  # e.g. report_to: [wandb, tensorboard]
            if item not in action.choices:
                raise ConfigError(
                    f"{path}: key '{key}': {item!r} is invalid (expected {_type_name(action)})"
                )
        return value
    if isinstance(value, list) and key in containers["mapping_items"]:
        if any(isinstance(item, dict) for item in value):
            return value  # mapping entries (e.g. benchmarks): the key's own check reads them
    if isinstance(value, dict):
        if key not in containers["dict"]:
            raise ConfigError(f"{path}: key '{key}': got a mapping, expected {_type_name(action)}")
        return value
    try:
        return _coerce(action, value)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else ""
        if not reason or "invalid literal" in reason or "could not convert" in reason:
            reason = f"expected {_type_name(action)}"
        raise ConfigError(f"{path}: key '{key}': {value!r} is invalid ({reason})") from None


def _read_aliases(raw: dict[str, Any], problems: Problems) -> tuple[dict[str, Any], list[str]]:
    """Keys of other toolkits accepted under our name (recipe/old_keys.py aliases)."""
    renamed, notes, table = {}, [], old_keys()
    for key, value in raw.items():
        target = aliases().get(key)
        if target is None:
            renamed.setdefault(key, value)
        elif target in raw:
            problems.add(
                f"keys '{key}' and '{target}' are the same key ({table[key].why}); "
                f"keep {target} only",
                [target],
            )
        else:
            renamed[target] = value
            notes.append(f"{problems.source}: key '{key}' is {table[key].why}")
    return renamed, notes


def _check_and_convert(
    raw: dict[str, Any],
    parser: argparse.ArgumentParser,
    method: str,
    problems: Problems,
) -> dict[str, Any]:
    """The recipe's values converted to their keys' types; each bad key is one problem."""
    path = problems.source
    actions = _actions_by_dest(parser)
    valid = sorted(k for k in actions if k != "help")
    containers = _containers(method)
    converted = {}
    for key, value in raw.items():
        with problems.check(key):
            if key not in actions or key == "help":
                line = other_method_problem(path, key, method)
                raise ConfigError(line or unknown_key_problem(path, key, value, valid))
            converted[key] = _convert_value(key, value, actions[key], path, containers)
    return converted


def take_flag(argv: list[str], flag: str, what: str) -> tuple[str | None, list[str]]:
    """Take `--flag VALUE` (or `--flag=VALUE`) out of argv: (the last value, the rest)."""
    rest, value, i = [], None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == flag:
            if i + 1 >= len(argv):
                raise ConfigError(f"command line: {flag} needs {what}")
            value, i = argv[i + 1], i + 2
            continue
        if arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return value, rest


def split_config_flag(argv: list[str]) -> tuple[str | None, list[str]]:
    """Take `--config PATH` (or `--config=PATH`) out of argv."""
    return take_flag(argv, "--config", "a recipe path")


def _parse_flags(
    parser: argparse.ArgumentParser, args: list[str], problems: Problems
) -> argparse.Namespace:
    """The flags over the recipe's values; a bad flag is one problem (the recipe's values stay)."""
    try:
        namespace, remaining = parser.parse_known_args(args)
    except ConfigError as exc:
        problems.add_error(exc)
        return parser.parse_known_args([])[0]
    valid = sorted("--" + k for k in _actions_by_dest(parser) if k != "help")
    for flag in (arg for arg in remaining if arg.startswith("-")):
        name = flag.split("=", 1)[0]
        problems.add(f"command line: unknown flag '{name}'; {_closest(name, valid)}", [name[2:]])
    if remaining and not any(arg.startswith("-") for arg in remaining):
        problems.add(f"command line: unexpected argument {remaining[0]!r}; flags are --key value")
    return namespace


def _read_env(env: Any, path: str) -> dict[str, str]:
    if not isinstance(env, dict):
        raise ConfigError(f"{path}: key 'env' must be a mapping of VARIABLE: value")
    return {str(key): str(value) for key, value in env.items()}


def _read_method(raw: dict[str, Any], requested: str | None, source: str) -> str:
    """The recipe's method; a bad or conflicting one stops the reading (which keys exist
    depends on it)."""
    declared = raw.pop("method", None)
    if declared is not None and declared not in METHODS:
        raise ConfigError(
            f"{source}: key 'method': {declared!r} is invalid (expected one of "
            f"{', '.join(METHODS)})"
        )
    return resolve_method(requested, declared, source)


def read_recipe(
    argv: list[str],
    method: str | None = None,
    parser_for: Callable[[str], argparse.ArgumentParser] | None = None,
) -> RecipeKeys:
    """Parse `--config recipe.yaml [--key value ...]` once into RecipeKeys.

    method: the one asked for (`--method`, MAXENT=1); None: the recipe's `method:` key, else
    grpo. Every problem (unknown keys, bad values, ranges) is found in one pass and raised as
    one ConfigError with a line each that names the file (or the command line); see
    recipe/problems.py. Ranges are checked here too, so every path (launcher or trainer) sees
    them. No TRL: the keys come from the committed schema (recipe/schema.py); TRL's own checks
    run when the sections are built (build_recipe). parser_for: the parser of a method's keys
    (tests pass TRL's own, schema.trl_parser, to compare).
    """
    path, args = split_config_flag(list(argv))
    source = path or "command line"
    with collecting(source) as problems:
        raw = load_recipe_file(path) if path is not None else {}
        method = _read_method(raw, method, source)
        env = {}
        if "env" in raw:
            with problems.check("env"):
                env = _read_env(raw.pop("env"), source)
        raw_sweep = raw.pop(SWEEP, None)  # the launcher's: the trainers' parser never sees it
        raw, notes = _read_aliases(raw, problems)
        parser = (parser_for or schema_parser)(method)
        parser.set_defaults_with_config(**_check_and_convert(raw, parser, method, problems))
        sweep = None
        if raw_sweep is not None:
            sweep = read_section(raw_sweep, source, problems)
            check_values(sweep, parser, method, problems)
        namespace = _parse_flags(parser, args, problems)
        keys = RecipeKeys(source, method, vars(namespace), env, tuple(args), tuple(notes), sweep)
        check_ranges(keys)
    return keys
