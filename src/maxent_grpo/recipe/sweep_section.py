"""A recipe's `sweep:` section: the grid `maxent-grpo sweep --config R` runs when no --grid
is given (with --grid, the two are merged key by key, --grid winning; launch/sweep.py).

    sweep:
      grid: {learning_rate: [1e-5, 3e-5], seed: [1, 2]}
      throttle: 2          # optional: at most N points at a time (sbatch --array=...%N)
      name: lr-seed        # optional: the sweep's name (default: output_dir's last part)

The section is the launcher's alone: `read_recipe` takes it out before the keys are parsed, so
the trainers (TRL's parser included) never see it. Each grid value is checked as the point will
get it, a `--key=value` flag through the recipe's own parser, plus the key's declared range;
every problem of the section is one line.
"""

from __future__ import annotations

import argparse
import difflib
from dataclasses import dataclass, field
from typing import Any

from maxent_grpo.errors import ConfigError
from maxent_grpo.recipe import schema
from maxent_grpo.recipe.declare import describe, in_range
from maxent_grpo.recipe.problems import Problems

SECTION = "sweep"
FIELDS = ("grid", "throttle", "name")
WHERE = ("output_dir", "run_name")  # set by each point itself


@dataclass(frozen=True)
class SweepSection:
    grid: dict[str, list[str]] = field(default_factory=dict)  # key -> values as flag text
    throttle: int | None = None
    name: str | None = None


def _text(value: Any) -> str:
    """A YAML scalar as it would be written after `--key=` (YAML's true -> `true`)."""
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


def check_grid_key(key: str, where: str) -> None:
    """A key a sweep may vary: not where each point writes (the section's and --grid's rule)."""
    if key in WHERE:
        raise ConfigError(f"{where} key '{key}': each point sets its own; drop it")


def _values(key: str, value: Any, where: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    if not items or any(v is None or isinstance(v, (list, dict)) for v in items):
        raise ConfigError(
            f"{where} key '{key}': {value!r} is not a list of values (none empty, null or "
            f"nested); write {key}: [a, b]"
        )
    texts = [_text(v) for v in items]
    if len(set(texts)) != len(texts):
        raise ConfigError(f"{where} key '{key}': {value!r} repeats a value; list each once")
    return texts


def _grid(raw: Any, where: str, problems: Problems) -> dict[str, list[str]]:
    if not isinstance(raw, dict) or not raw:
        problems.add(
            f"{where}: {raw!r} is not a mapping of key: [values]; e.g. grid: "
            "{learning_rate: [1e-5, 3e-5]}",
            [SECTION],
        )
        return {}
    grid = {}
    for key, value in raw.items():
        with problems.check(SECTION):
            check_grid_key(str(key), where)
            grid[str(key)] = _values(str(key), value, where)
    return grid


def read_section(raw: Any, source: str, problems: Problems) -> SweepSection:
    """The section's shape (grid, throttle, name), each problem one line in `problems`."""
    where = f"{source}: {SECTION}:"
    if not isinstance(raw, dict):
        problems.add(f"{where} expected a mapping with grid: (and throttle:, name:)", [SECTION])
        return SweepSection()
    for key in raw:
        if key not in FIELDS:
            near = difflib.get_close_matches(str(key), FIELDS, n=1)
            fix = f"did you mean '{near[0]}'?" if near else f"its keys are {', '.join(FIELDS)}"
            problems.add(f"{where} unknown key '{key}'; {fix}", [SECTION])
    if "grid" not in raw:
        problems.add(f"{where} no grid; add grid: {{key: [value, ...]}}", [SECTION])
    grid = _grid(raw["grid"], f"{where} grid", problems) if "grid" in raw else {}
    throttle, name = raw.get("throttle"), raw.get("name")
    if throttle is not None and (
        not isinstance(throttle, int) or isinstance(throttle, bool) or throttle < 1
    ):
        problems.add(f"{where} throttle: {throttle!r} is invalid; give an integer >= 1", [SECTION])
        throttle = None
    if name is not None and (not isinstance(name, str) or not name.strip()):
        problems.add(f"{where} name: {name!r} is invalid; give a non-empty string", [SECTION])
        name = None
    return SweepSection(grid, throttle, name)


def check_values(
    section: SweepSection, parser: argparse.ArgumentParser, method: str, problems: Problems
) -> None:
    """Every grid value as its point gets it (`--key=value` through the recipe's parser), and
    in the key's declared range; an unknown key or a bad value is one line each."""
    where = f"{problems.source}: {SECTION}: grid"
    ranges = schema.ranges()
    for key, values in section.grid.items():
        for value in values:
            try:
                parsed, rest = parser.parse_known_args([f"--{key}={value}"])
            except ConfigError as exc:
                reason = str(exc).removeprefix("command line: ")
                problems.add(f"{where} key '{key}': {value!r} is invalid ({reason})", [SECTION])
                continue
            if rest:
                known = sorted(schema.method_keys(method))
                near = difflib.get_close_matches(key, known, n=1)
                fix = f"did you mean '{near[0]}'?" if near else "see the recipe key reference"
                problems.add(f"{where} unknown key '{key}'; {fix}", [SECTION])
                break
            got, rule = getattr(parsed, key), ranges.get(key)
            if rule and isinstance(got, (int, float)) and not in_range(got, rule):
                problems.add(
                    f"{where} key '{key}': {value!r} is invalid (must be {describe(rule)})",
                    [SECTION],
                )
