"""The package's layers (docs/architecture.md "Layers"), read from the source with `ast`.

Each package imports only from the layers below it (module-level and function-level imports
alike); packages of one layer do not import each other; the launcher, evaluations and the runs
table never import the trainer process (train/, maxent/). An import inside a function defers a
heavy library, or says on its line (or the line above) why it is there.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "maxent_grpo"

# Bottom first. A unit is a package (recipe) or a top-level module (cli).
LAYERS: list[set[str]] = [
    {"__init__", "errors", "timers"},  # import nothing of the package
    {
        "faults",
        "tiny_model",
        "methods",
        "rundir",
        "vllm_health",
        "server_auth",
        "rollout_filters",
        "rollout_func",
    },
    {"recipe"},
    {"data", "rewards"},
    {"benchmarks"},  # a recipe's benchmarks: spec, data, check (data/ + rewards/)
    {"preflight"},  # the built recipe's checks that need data/, rewards/, benchmarks/
    {"train"},
    {"maxent"},  # built on train/ (its trainer class, the KL controller)
    {"launch", "evaluate", "runs"},
    {"migrate"},  # recipes of other toolkits rewritten (the plan's processes: launch/plan)
    {"cli_parser"},  # the command's arguments (methods.py's names only)
    {"cli", "train_process"},
]
# Modules whose layer is not their package's (none today: MaxEnt's recipe keys are recipe/'s).
MODULE_LAYER: dict[str, str] = {}
# Never imported by these, whatever the layers say: the trainer process stays out of them.
FORBIDDEN = {
    ("launch", "train"),
    ("launch", "maxent"),
    ("evaluate", "train"),
    ("evaluate", "maxent"),
    ("runs", "train"),
    ("runs", "maxent"),
    ("migrate", "train"),
    ("migrate", "maxent"),
}
# Deferred inside a function without a comment: slow to import (seconds, or hundreds of MiB).
HEAVY = {
    "accelerate",
    "datasets",
    "deepspeed",
    "matplotlib",
    "peft",
    "safetensors",
    "tokenizers",
    "torch",
    "transformers",
    "trl",
    "vllm",
    "wandb",
}
# Known breaches, each to be removed by the change that fixes it (a stale entry fails).
PENDING: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    module: str  # importing module, e.g. "train.entry"
    target: str  # imported module, absolute
    line: int
    in_function: bool
    commented: bool


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _commented(lines: list[str], node: ast.stmt) -> bool:
    own = lines[node.lineno - 1 : node.end_lineno]
    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
    return any("#" in line for line in own) or above.startswith("#")


def imports_of(path: Path) -> list[Import]:
    source = path.read_text()
    lines = source.splitlines()
    found = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                targets = [child.module]
                if child.module == "maxent_grpo":  # from maxent_grpo import runs
                    targets = [f"maxent_grpo.{alias.name}" for alias in child.names]
            else:
                inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                walk(child, in_function or inner)
                continue
            for target in targets:
                commented = _commented(lines, child)
                found.append(
                    Import(_module_name(path), target, child.lineno, in_function, commented)
                )

    walk(ast.parse(source), False)
    return found


def all_imports() -> list[Import]:
    return [i for path in sorted(PACKAGE.rglob("*.py")) for i in imports_of(path)]


def unit_of(module: str) -> str:
    """The layer unit of a module name relative to the package ("train.entry" -> "train")."""
    for prefix, unit in MODULE_LAYER.items():
        if module == prefix or module.startswith(prefix + "."):
            return unit
    return module.split(".")[0]


def rank_of(module: str) -> int:
    if module.split(".")[-1] == "__main__":
        return len(LAYERS) - 1  # an entry point, never imported: on top like cli.py
    unit = unit_of(module)
    for rank, units in enumerate(LAYERS):
        if unit in units:
            return rank
    raise AssertionError(f"maxent_grpo.{module} is in no layer: add it to LAYERS")


def breach(imp: Import) -> str | None:
    """Why an import between the package's modules breaks the layers, or None."""
    if not imp.target.startswith("maxent_grpo."):
        return None
    target = imp.target.removeprefix("maxent_grpo.")
    mine, theirs = unit_of(imp.module), unit_of(target)
    if mine == theirs:
        return None
    if (mine, theirs) in FORBIDDEN:
        return "the trainer process is not imported here"
    if rank_of(target) > rank_of(imp.module):
        return "imports a layer above"
    if rank_of(target) == rank_of(imp.module) and imp.module.split(".")[-1] != "__main__":
        return "imports a package of its own layer"
    return None


def breaches(imports: list[Import]) -> dict[tuple[str, str], str]:
    found = {}
    for imp in imports:
        if why := breach(imp):
            key = (imp.module, imp.target.removeprefix("maxent_grpo."))
            found[key] = f"maxent_grpo.{imp.module}:{imp.line} imports {imp.target}: {why}"
    return found


def unexplained_deferrals(imports: list[Import]) -> list[str]:
    return [
        f"maxent_grpo.{i.module}:{i.line} imports {i.target} inside a function without a reason"
        for i in imports
        if i.in_function and i.target.split(".")[0] not in HEAVY and not i.commented
    ]


def test_every_module_is_in_a_layer():
    for path in PACKAGE.rglob("*.py"):
        rank_of(_module_name(path))


def test_imports_point_down_the_layers():
    found = breaches(all_imports())
    new = {key: why for key, why in found.items() if key not in PENDING}
    assert not new, "\n".join(sorted(new.values()))
    fixed = PENDING - set(found)
    assert not fixed, f"no longer breached, remove from PENDING: {sorted(fixed)}"


def test_imports_inside_functions_defer_a_heavy_library_or_say_why():
    pending = {f"maxent_grpo.{m}:" for m, _ in PENDING}
    found = unexplained_deferrals(all_imports())
    assert [line for line in found if not line.startswith(tuple(pending))] == []


def _one_module(tmp_path: Path, name: str, source: str) -> list[Import]:
    path = tmp_path / "maxent_grpo" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    found = imports_of(path)
    return [
        Import(
            name.removesuffix(".py").replace("/", "."),
            i.target,
            i.line,
            i.in_function,
            i.commented,
        )
        for i in found
    ]


@pytest.fixture
def package_at(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "maxent_grpo")
    return tmp_path


@pytest.mark.parametrize(
    ("name", "source", "why"),
    [
        ("train/x.py", "from maxent_grpo.launch.server import probe\n", "a layer above"),
        ("launch/x.py", "from maxent_grpo.train.entry import train\n", "the trainer process"),
        ("recipe/x.py", "def f():\n    from maxent_grpo.evaluate import run\n", "a layer above"),
        ("runs/x.py", "from maxent_grpo.evaluate.run import step_of\n", "its own layer"),
        ("rewards/x.py", "from maxent_grpo import data\n", "its own layer"),
        ("errors.py", "from maxent_grpo.recipe import keys\n", "a layer above"),
    ],
)
def test_a_broken_layer_is_caught(package_at, name, source, why):
    imports = _one_module(package_at, name, source)
    (found,) = breaches(imports).values()
    assert why in found


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("launch/x.py", "from maxent_grpo.recipe import read_recipe\n"),
        ("maxent/x.py", "from maxent_grpo.train.checkpoints import CompleteCheckpoints\n"),
        ("train/__main__.py", "from maxent_grpo.train_process import main\n"),
        ("recipe/x.py", "from maxent_grpo.rollout_filters import find_filter\n"),
    ],
)
def test_imports_down_the_layers_pass(package_at, name, source):
    assert breaches(_one_module(package_at, name, source)) == {}


def test_a_deferred_import_needs_a_heavy_library_or_a_reason(package_at):
    source = (
        "def f():\n"
        "    import torch\n"
        "    import json\n"
        "    from maxent_grpo.data import load_datasets  # imports datasets\n"
        "    # a cycle: b imports this module\n"
        "    from maxent_grpo.recipe import b\n"
    )
    imports = _one_module(package_at, "recipe/x.py", source)
    assert [line.split(" inside")[0] for line in unexplained_deferrals(imports)] == [
        "maxent_grpo.recipe.x:3 imports json"
    ]


def test_the_launcher_and_the_trainer_main_import_no_heavy_library():
    """`maxent-grpo` (run, check, runs ...) answers before torch or TRL could load, and the
    trainer's main reads the recipe (and marks unused libraries absent) before TRL loads."""
    modules = ["maxent_grpo.cli", "maxent_grpo.train_process", "maxent_grpo.methods"]
    code = f"import sys\nfor m in {modules}: __import__(m)\n"
    code += f"print(sorted(set(sys.modules) & {HEAVY}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
