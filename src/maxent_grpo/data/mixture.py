"""Dataset mixtures: the recipe's `dataset_mixture` mapping, validated once into typed entries."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from maxent_grpo.data.builtin import BUILTIN_NAMES, BUILTIN_PREFIX
from maxent_grpo.data.errors import DataError


@dataclass(frozen=True)
class MixtureEntry:
    """One source of a mixture; exactly one of `id` (hub or builtin:NAME) and `path` is set."""

    id: str | None
    path: str | None
    config: str | None = None
    split: str = "train"
    columns: tuple[str, ...] | None = None
    weight: float = 1.0


@dataclass(frozen=True)
class DatasetMixture:
    """Several sources subsampled by weight, concatenated and shuffled with `seed`."""

    datasets: tuple[MixtureEntry, ...]
    seed: int = 0
    test_split_size: float | None = None


# Validate the raw recipe dict once, so loading code can trust its input.

_MIXTURE_KEYS = ("datasets", "seed", "test_split_size")
_ENTRY_KEYS = ("id", "path", "config", "split", "columns", "weight")


def _bad(source: str, key: str, problem: str, value: Any, fix: str) -> DataError:
    """Build the one-line error: where, what, the offending value, and how to fix it."""
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return DataError(f"{source}: {key}: {problem} (got {shown}); {fix}")


def _check_keys(raw: Mapping, allowed: Sequence[str], source: str, key: str) -> None:
    """Reject unknown keys, the usual symptom of a typo that would otherwise be ignored."""
    for k in raw:
        if k not in allowed:
            raise _bad(
                source, f"{key}.{k}", "unknown key", raw[k], f"use one of: {', '.join(allowed)}"
            )


def _optional_str(raw: Mapping, name: str, source: str, key: str) -> str | None:
    """A non-empty string or None/absent."""
    value = raw.get(name)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise _bad(source, f"{key}.{name}", "must be a non-empty string", value, "fix or remove it")
    return value


def _parse_columns(value: Any, source: str, key: str) -> tuple[str, ...] | None:
    """A non-empty list of distinct column names, or None to keep every column."""
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(c, str) and c for c in value)
        or len(set(value)) != len(value)
    ):
        raise _bad(
            source,
            key,
            "must be a non-empty list of distinct column names",
            value,
            "e.g. columns: [problem, solution], or remove it to keep every column",
        )
    return tuple(value)


def _parse_weight(value: Any, source: str, key: str) -> float:
    """The fraction of rows to keep: a number in (0, 1]."""
    if value is None:
        return 1.0
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 0 < value <= 1:
        raise _bad(
            source,
            key,
            "must be a number with 0 < weight <= 1",
            value,
            "it is the fraction of that dataset's rows to keep, e.g. 0.5",
        )
    return float(value)


def _parse_id(value: Any, source: str, key: str) -> str | None:
    """A hub id or builtin:NAME with a known NAME."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _bad(source, key, "must be a non-empty string", value, "e.g. id: builtin:arithmetic")
    if value.startswith(BUILTIN_PREFIX) and value[len(BUILTIN_PREFIX) :] not in BUILTIN_NAMES:
        names = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_NAMES)
        raise _bad(source, key, "unknown builtin dataset", value, f"use one of: {names}")
    return value


def _parse_entry(raw: Any, source: str, key: str) -> MixtureEntry:
    """Validate one `datasets[i]` mapping."""
    if not isinstance(raw, Mapping):
        raise _bad(source, key, "must be a mapping", raw, "e.g. {id: builtin:arithmetic}")
    _check_keys(raw, _ENTRY_KEYS, source, key)
    dataset_id = _parse_id(raw.get("id"), source, f"{key}.id")
    path = _optional_str(raw, "path", source, key)
    if (dataset_id is None) == (path is None):
        raise _bad(
            source,
            key,
            "needs exactly one of 'id' and 'path'",
            dict(raw),
            "set id (hub id or builtin:NAME) or path (local file/directory), not both",
        )
    split = raw.get("split", "train")
    if not isinstance(split, str) or not split.strip():
        raise _bad(source, f"{key}.split", "must be a non-empty string", split, "e.g. split: train")
    if split != "train" and (path is not None or dataset_id.startswith(BUILTIN_PREFIX)):
        raise _bad(
            source,
            f"{key}.split",
            "local files and builtin datasets only have 'train'",
            split,
            "remove 'split' (use dataset_mixture.test_split_size for a test split)",
        )
    config = _optional_str(raw, "config", source, key)
    return MixtureEntry(
        id=dataset_id,
        path=path,
        config=config,
        split=split,
        columns=_parse_columns(raw.get("columns"), source, f"{key}.columns"),
        weight=_parse_weight(raw.get("weight"), source, f"{key}.weight"),
    )


def _parse_seed(value: Any, source: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(source, "dataset_mixture.seed", "must be an integer", value, "e.g. seed: 0")
    return value


def _parse_test_split_size(value: Any, source: str) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 0 <= value < 1:
        raise _bad(
            source,
            "dataset_mixture.test_split_size",
            "must be a number with 0 <= x < 1",
            value,
            "e.g. test_split_size: 0.1, or remove it for no test split",
        )
    return float(value)


def parse_mixture(raw: dict | None, source: str = "recipe") -> DatasetMixture | None:
    """Validate a recipe's `dataset_mixture` mapping; None means "no mixture"."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise _bad(
            source,
            "dataset_mixture",
            "must be a mapping",
            raw,
            "write dataset_mixture: {datasets: [{id: ...}], seed: 0}",
        )
    _check_keys(raw, _MIXTURE_KEYS, source, "dataset_mixture")
    entries = raw.get("datasets")
    if not isinstance(entries, list) or not entries:
        raise _bad(
            source,
            "dataset_mixture.datasets",
            "must be a non-empty list",
            entries,
            "list at least one {id: ...} or {path: ...} entry",
        )
    return DatasetMixture(
        datasets=tuple(
            _parse_entry(e, source, f"dataset_mixture.datasets[{i}]") for i, e in enumerate(entries)
        ),
        seed=_parse_seed(raw.get("seed"), source),
        test_split_size=_parse_test_split_size(raw.get("test_split_size"), source),
    )
