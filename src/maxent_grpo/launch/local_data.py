"""Before launch: the recipe's local data files exist and hold the columns it names.

The launcher imports no `datasets` (seconds per attempt). Which names are local and which
files are their data is data/sources.py's (source_kind, local_files), as for the trainers'
loader; the column names are read from the first file's head: a JSON Lines file's first
record, a CSV header, a Parquet schema, a JSON file's first record. Anything not readable this
cheaply is left to the trainers (data/load.py preflight_columns, which `maxent-grpo check`
runs), with the same messages.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from maxent_grpo.data.errors import DataError
from maxent_grpo.data.sources import local_files, source_kind
from maxent_grpo.errors import ConfigError

COLUMNS_FIX = "set dataset_prompt_column / dataset_answer_column (or the mixture 'columns')"


def _sources(values: Mapping[str, Any]) -> Iterator[tuple[str, str, list[str] | None]]:
    """(name, key path, the entry's kept columns) for each local source of the recipe."""
    mixture = values.get("dataset_mixture")
    if isinstance(mixture, Mapping):
        for i, entry in enumerate(mixture.get("datasets") or []):
            if not isinstance(entry, Mapping):
                continue  # the trainers' mixture parser says what is wrong with it
            is_path = isinstance(entry.get("path"), str)
            name = entry["path"] if is_path else entry.get("id")
            if isinstance(name, str) and source_kind(name, is_path) == "local":
                yield name, f"dataset_mixture.datasets[{i}]", entry.get("columns")
        return
    name = values.get("dataset_name")
    if isinstance(name, str) and source_kind(name) == "local":
        yield name, "dataset_name", None


def header(path: Path) -> list[str] | None:
    """The column names at the head of a data file; None where that is not cheap to tell."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            with path.open(encoding="utf-8") as f:
                line = next((line for line in f if line.strip()), "")
            row = json.loads(line) if line else None
        elif suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            row = data[0] if isinstance(data, list) and data else None
        elif suffix == ".csv":
            with path.open(encoding="utf-8", newline="") as f:
                return next(csv.reader(f), None)
        else:
            import pyarrow.parquet  # deferred: only for a Parquet source (no datasets import)

            return list(pyarrow.parquet.read_schema(path).names)
    except (OSError, ValueError, UnicodeDecodeError):
        return None  # unreadable or malformed: the trainers' loader says why
    return list(row) if isinstance(row, dict) else None


def check_local_data(values: Mapping[str, Any]) -> None:
    """Each local source exists, and its first file has the prompt and answer columns (and a
    mixture entry's kept columns). One line, as the trainers' check would say it."""
    required = [values.get("dataset_prompt_column"), values.get("dataset_answer_column")]
    for name, where, kept in _sources(values):
        try:
            _builder, files = local_files(name, where)
        except DataError as exc:  # a problem of the recipe, collected with the others
            raise ConfigError(str(exc)) from None
        available = header(Path(files[0]))
        if available is None:
            continue
        if kept:
            _check_columns(available, kept, name, where, "set 'columns' or the prompt column")
            available = list(kept)
        _check_columns(available, required, name, where, COLUMNS_FIX)


def _check_columns(available, required, name: str, where: str, fix: str) -> None:
    for column in required:
        if column is not None and column not in available:
            raise ConfigError(
                f"{where}: column {column!r} not in {name} (columns: {', '.join(available)}); {fix}"
            )


def check_reward_names(names: Any) -> None:
    """Each reward name is a built-in or a 'module:function' spec, as `check` and the trainers
    require (they also load custom specs, which may import anything: left to them)."""
    # deferred: the rewards import math-verify and sympy (~0.4 s), needed only here
    from maxent_grpo.rewards import RewardError, get_reward_funcs, list_reward_names

    if not isinstance(names, list) or not names:
        return  # an empty or mistyped list: the parser and the trainers' check say it
    known = set(list_reward_names())
    for name in names:
        if isinstance(name, str) and name.strip() not in known and ":" not in name:
            try:
                get_reward_funcs([name])  # raises the registry's own line (unknown, judged)
            except RewardError as exc:
                raise ConfigError(str(exc)) from None
