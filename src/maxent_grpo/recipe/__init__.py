"""One typed recipe: parsed once (parser), built for a number of processes, checked (checks).

    keys = read_recipe(argv, method)          # YAML + flags: names, types, choices, ranges
    recipe = build_recipe(keys, world_size)   # typed sections, batch arithmetic, TRL's checks
    recipe = check_recipe(recipe)             # model path, rewards, data, output dir

read_recipe needs no TRL (the keys' schema is committed: recipe/schema.py), so the launcher
reads, plans and checks from the keys alone (`launch/launcher.py` prepare); the typed sections,
with TRL's own checks, are built once, in the trainers (for their WORLD_SIZE), and by
`maxent-grpo check` (for the plan's number of processes). Importing this package imports no
TRL either; build_recipe does. Each step reports all of its problems at once (one
ConfigProblems, recipe/problems.py); `maxent-grpo check` collects those of all three.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from maxent_grpo.errors import ConfigError, ConfigProblems, exception_text
from maxent_grpo.recipe.checks import batch_for_processes
from maxent_grpo.recipe.parser import RecipeKeys, read_recipe, split_config_flag
from maxent_grpo.recipe.problems import Problems, collecting

if TYPE_CHECKING:
    from maxent_grpo.recipe.keys import GRPOConfig, LauncherKeys, ScriptArguments

__all__ = [
    "ConfigError",
    "Recipe",
    "RecipeKeys",
    "build_recipe",
    "parse_recipe",
    "read_recipe",
]


@dataclass(frozen=True)
class Recipe:
    """A recipe's typed sections, built for `world_size` training processes."""

    path: str  # the recipe file, or "command line"
    method: str  # a name of maxent_grpo.methods.METHODS
    script: ScriptArguments
    training: GRPOConfig  # MaxEntConfig for method maxent
    model: Any  # trl.ModelConfig
    launch: LauncherKeys
    env: Mapping[str, str]  # the `env:` block, applied where a process starts
    overrides: tuple[str, ...]  # the flags after the recipe file
    world_size: int
    notes: tuple[str, ...] = ()  # `note:` lines for check: aliases read, then what checks add
    resolved: Any = None  # preflight.Resolved: the rewards, tools, environment check_recipe made

    @property
    def output_dir(self) -> str:
        return self.training.output_dir


# TRL's GRPOConfig repeats the batch rules of recipe/checks.py (ours name the fix): after one
# of ours failed, its lines saying so are the same problem again.
_TRL_BATCH_RULE = re.compile(r"must be divisible by")


# What TRL's and transformers' `__post_init__` raise for a bad value (an enum lookup, a
# division by a zero batch, an assert); anything else is a bug and keeps its traceback.
_SECTION_ERRORS = (ValueError, TypeError, KeyError, AssertionError, ArithmeticError)


def _build_section(
    section: type, values: Mapping[str, Any], problems: Problems, batch_failed: bool = False
):
    """One section from the values, or None with its problems added.

    A section that fails while one of its keys already has a problem (its default stands in for
    the bad value) adds nothing when its message names such a key: fixing that key comes first.
    """
    names = {f.name for f in dataclasses.fields(section) if f.init}
    # A key with a problem already: its field's default stands in for the bad value.
    usable = {k: v for k, v in values.items() if k in names and k not in problems.bad_keys}
    try:
        return section(**usable)
    except ConfigError as exc:
        error = exc
    except _SECTION_ERRORS as exc:
        # TRL's and transformers' own checks (a KeyError or AssertionError included): one line.
        error = ConfigError(exception_text(exc))
    lines = error.problems if isinstance(error, ConfigProblems) else (str(error),)
    suspect = problems.bad_keys & names
    for line in lines:
        repeated = batch_failed and _TRL_BATCH_RULE.search(line)
        if not repeated and not any(re.search(rf"\b{re.escape(k)}\b", line) for k in suspect):
            problems.add(line)
    return None


def build_recipe(keys: RecipeKeys, world_size: int) -> Recipe:
    """The typed sections of `keys` for `world_size` training processes, every value checked.

    Every problem is raised together (recipe/problems.py); inside an outer `collecting` (the
    `check` command) a section that could not be built is None and the problems go outwards.
    """
    from maxent_grpo.recipe.keys import planned_world_size  # imports TRL
    from maxent_grpo.recipe.sections import SECTIONS  # imports TRL

    with collecting(keys.path) as problems:
        before = len(problems.lines)
        values, steps = batch_for_processes(dict(keys.values), world_size)
        batch_failed = len(problems.lines) > before
        with planned_world_size(world_size):
            script, training, model, launch = (
                _build_section(section, values, problems, batch_failed)
                for section in SECTIONS[keys.method]
            )
        if training is not None and steps is not None:  # None: SFT, which generates nothing
            # TRL derived it for its own process count; this is the one for `world_size`.
            training.steps_per_generation = steps
    return Recipe(
        path=keys.path,
        method=keys.method,
        script=script,
        training=training,
        model=model,
        launch=launch,
        env=dict(keys.env),
        overrides=keys.overrides,
        world_size=world_size,
        notes=keys.notes,
    )


def parse_recipe(argv: list[str], method: str | None = None, world_size: int = 1) -> Recipe:
    """read_recipe then build_recipe: the typed recipe for `world_size` processes (the problems
    of both, together)."""
    path, _ = split_config_flag(list(argv))
    with collecting(path or "command line"):
        recipe = build_recipe(read_recipe(argv, method), world_size)
    return recipe
