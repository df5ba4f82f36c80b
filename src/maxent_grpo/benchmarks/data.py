"""A benchmark's rows: loaded from a built-in, a local file or the hub, in TRL's prompt format.

Built-in datasets have two splits here: `train` (the recipe's training rows: dataset_num_rows
rows from dataset_seed) and `test` (rows from another seed, with every problem that is also a
training row left out). Hub datasets are only read where the hub is reachable, or from the
local cache: offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE), a dataset that is not cached is a
one-line error at the recipe check.
"""

from __future__ import annotations

import os
from typing import Any

from maxent_grpo.benchmarks.spec import Benchmark
from maxent_grpo.data import (
    BUILTIN_COLUMNS,
    BUILTIN_PREFIX,
    DataError,
    builtin_dataset,
    source_kind,
    to_conversation,
)
from maxent_grpo.data.load import check_columns, load_local

# The held-out rows of a built-in come from dataset_seed + this.
HELD_OUT_SEED_OFFSET = 1_000_003


def hub_offline(environ=os.environ) -> bool:
    return any(
        environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def where(index: int, bench: Benchmark) -> str:
    return f"benchmarks[{index}] ({bench.name})"


def held_out_rows(name: str, rows: int, script: Any):
    """`rows` generated problems of builtin:NAME that are not among the recipe's training rows."""
    import datasets

    training = builtin_dataset(name, num_rows=script.dataset_num_rows, seed=script.dataset_seed)
    train = set(training["problem"])
    seed = script.dataset_seed + HELD_OUT_SEED_OFFSET
    wanted = rows + rows // 2 + 16
    for _ in range(6):  # each round asks for twice as many; collisions are rare
        generated = builtin_dataset(name, num_rows=wanted, seed=seed)
        kept = [i for i, p in enumerate(generated["problem"]) if p not in train][:rows]
        if len(kept) == rows:
            return generated.select(kept)
        wanted *= 2
    return datasets.Dataset.from_dict({c: [] for c in BUILTIN_COLUMNS})


def _raw_rows(bench: Benchmark, script: Any, label: str):
    """The benchmark's split, before conversion."""
    import datasets

    kind = source_kind(bench.dataset)
    if kind == "builtin":
        name = bench.dataset[len(BUILTIN_PREFIX) :]
        if bench.split == "train":
            return builtin_dataset(name, num_rows=script.dataset_num_rows, seed=script.dataset_seed)
        return held_out_rows(name, bench.num_examples or 200, script)
    if kind == "local":
        if bench.split != "train":
            raise DataError(
                f"{label}: split: {bench.split!r}: a local file has one split, 'train'; "
                "set split: train (or leave it out)"
            )
        return load_local(bench.dataset, label)
    try:
        return datasets.load_dataset(bench.dataset, bench.dataset_config, split=bench.split)
    except Exception as exc:  # noqa: BLE001 - the hub's errors are many; one line for each
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        offline = " (offline: HF_HUB_OFFLINE is set and it is not cached)" if hub_offline() else ""
        raise DataError(
            f"{label}: cannot load hub dataset {bench.dataset!r} split {bench.split!r}{offline}: "
            f"{reason}; run once where the hub is reachable, or use a local file"
        ) from None


def load_rows(bench: Benchmark, script: Any, label: str):
    """The benchmark's rows (the first num_examples) with a conversational `prompt` and a str
    `solution` (the reward's reference) beside the dataset's other columns."""
    rows = _raw_rows(bench, script, label)
    if bench.num_examples is not None and len(rows) > bench.num_examples:
        rows = rows.select(range(bench.num_examples))
    if len(rows) == 0:
        raise DataError(f"{label}: {bench.dataset} [{bench.split}] has 0 rows; use another split")
    return to_conversation(
        rows,
        bench.prompt_column,
        bench.answer_column,
        bench.system_prompt,
        name=f"{bench.dataset} [{bench.split}]",
        where=label,
    )


def check_data(bench: Benchmark, script: Any, label: str) -> None:
    """What can be checked before a model loads: built-in columns, local files and columns,
    the split of a local file, and (offline) that a hub dataset is cached."""
    kind = source_kind(bench.dataset)
    required = [bench.prompt_column, bench.answer_column]
    fix = "set the benchmark's prompt_column / answer_column"
    if kind == "builtin":
        name = bench.dataset[len(BUILTIN_PREFIX) :]
        builtin_dataset(name, num_rows=1, seed=0)  # an unknown name: its one-line error
        check_columns(BUILTIN_COLUMNS, required, bench.dataset, label, fix)
    elif kind == "local" or hub_offline():
        columns = _raw_rows(bench, script, label).column_names
        check_columns(columns, required, bench.dataset, label, fix)
