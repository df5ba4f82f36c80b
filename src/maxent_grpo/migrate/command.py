"""`maxent-grpo migrate SOURCE`: which source format a file is, its translation, and the
allocation its result is checked for. The CLI prints and checks (cli.py `_migrate`).

Formats: a YAML recipe of open-r1, older TRL or upstream MaxEnt-GRPO (engine.py, line edits);
a verl shell script running verl.trainer.main_ppo or a verl YAML config (verl.py); a prime-rl
TOML config (prime_rl.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from maxent_grpo.migrate import prime_rl, verl, verl_script
from maxent_grpo.migrate.edits import Change
from maxent_grpo.migrate.engine import migrate_text
from maxent_grpo.recipe.parser import load_recipe_file


@dataclass(frozen=True)
class Translation:
    text: str
    changes: list[Change]
    arithmetic: list[str] = field(default_factory=list)  # the batch re-fit, one line each
    gpus: int | None = None  # the allocation to check for: the source's when not asked
    nodes: int = 1


def _data_sources(files: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """verl's data_source values of each training file (its parquet column), else guessed from
    the file's folder (a note says so)."""
    found, notes = verl.guess_sources([f for f in files if not Path(f).expanduser().is_file()]), []
    for name in found:
        notes.append(f"{name} is not on this machine: its data_source guessed from its folder")
    for name in files:
        path = Path(name).expanduser()
        if path.is_file():
            import pyarrow.parquet as pq  # reads one column of verl's parquet; migrate only

            table = pq.read_table(path, columns=["data_source"])
            found[name] = sorted(set(table.column("data_source").to_pylist()))
    return found, notes


def _verl(keys: dict, source: str, gpus: int | None, nodes: int) -> Translation:
    run = verl.Verl(keys)
    if gpus is None:  # the script's own allocation
        gpus, nodes = run("trainer.n_gpus_per_node"), run("trainer.nnodes")
    sources, notes = _data_sources(verl.train_files(keys))
    recipe, arithmetic = verl.verl_recipe(keys, source, gpus * nodes, sources)
    lines = [f"{gpus * nodes} training processes ({nodes} node(s) x {gpus} GPUs, vLLM colocated)"]
    return Translation(recipe.text(), recipe.changes, [*lines, *arithmetic, *notes], gpus, nodes)


def translate(
    path: str,
    gpus: int | None,
    nodes: int,
    trl_version: str | None,
    environ: Mapping[str, str],
) -> Translation:
    """The translation of the file at `path` for `gpus` x `nodes` (None: the source's)."""
    text = Path(path).read_text()
    if verl_script.is_verl_script(text):
        return _verl(verl_script.read_script(text, environ, path), path, gpus, nodes)
    if path.endswith(".toml"):
        recipe, arithmetic, allocation = prime_rl.prime_rl_recipe(text, path, gpus, nodes)
        return Translation(recipe.text(), recipe.changes, arithmetic, *allocation)
    data = load_recipe_file(path)  # one line for a malformed file
    if verl_script.is_verl_config(data):
        return _verl(verl_script.flatten(data), path, gpus, nodes)
    text, changes = migrate_text(text, path, gpus and gpus * nodes, trl_version=trl_version)
    return Translation(text, changes, [], gpus, nodes)
