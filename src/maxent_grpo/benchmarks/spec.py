"""Benchmarks: how a recipe names them, what each one is, and the one-line checks of both.

A recipe's `benchmarks:` is a list whose entries are either a built-in name or a mapping:

    benchmarks:
      - arithmetic                        # built-in: held-out builtin:arithmetic, greedy
      - {name: arithmetic_pass8, dataset: builtin:arithmetic, num_samples: 8, k: 8,
         temperature: 1.0}
      - {name: mine, dataset: data/test.jsonl, prompt_column: question, answer_column: answer,
         reward: answer_match, num_examples: 100}

A mapping whose `name` is a built-in and that gives no `dataset` starts from that built-in's
settings. Everything here is pure: nothing is loaded (data checks live in `benchmarks.data`).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from maxent_grpo.data.sources import source_kind
from maxent_grpo.errors import ConfigError

_UNSET: Any = object()


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: a dataset split, its columns, a scoring reward, generation settings."""

    name: str
    dataset: str  # builtin:NAME, a local file or directory, or a hub id
    split: str | None = None  # None: test (built-in, hub) or train (a local file's only split)
    dataset_config: str | None = None
    prompt_column: str = "problem"
    answer_column: str | None = "solution"
    reward: str = "accuracy"
    num_examples: int | None = None  # the first N rows (None: all; built-ins: 200)
    num_samples: int = 1  # completions per prompt (n)
    k: int = 1  # pass@k, k <= num_samples
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    max_new_tokens: int | None = None  # None: the recipe's max_completion_length
    pass_threshold: float = 1.0  # a completion passes when its reward is >= this
    batch_size: int = 16  # prompts per generation batch
    seed: int = 0
    system_prompt: str | None = _UNSET  # unset: the recipe's system_prompt

    @property
    def metric(self) -> str:
        return f"pass@{self.k}"

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


BUILTIN_BENCHMARKS: dict[str, Benchmark] = {
    "arithmetic": Benchmark("arithmetic", "builtin:arithmetic", "test", num_examples=200),
    "word_problems": Benchmark("word_problems", "builtin:word_problems", "test", num_examples=200),
}
FIELDS = tuple(f.name for f in fields(Benchmark))
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_INTS = {
    "num_examples": 1,
    "num_samples": 1,
    "k": 1,
    "max_new_tokens": 1,
    "batch_size": 1,
    "seed": 0,
}
_FLOATS = ("temperature", "top_p", "pass_threshold")
_STRINGS = ("name", "dataset", "split", "dataset_config", "prompt_column", "reward")


def _where(index: int, name: Any = None) -> str:
    return f"benchmarks[{index}]" + (f" ({name})" if isinstance(name, str) and name else "")


def _closest(key: str, valid) -> str:
    match = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return f"did you mean {match[0]!r}?" if match else "valid: " + ", ".join(valid)


def _check_int(where: str, key: str, value: Any) -> None:
    if value is None and key in ("num_examples", "max_new_tokens"):
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < _INTS[key]:
        raise ConfigError(
            f"{where}: {key}: {value!r} is invalid (an integer >= {_INTS[key]}); fix {key}"
        )


def _check_float(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: {key}: {value!r} is invalid (a number); fix {key}")
    return float(value)


def _check_types(where: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The mapping's values type-checked; floats made floats."""
    out = dict(entry)
    for key, value in entry.items():
        if key in _INTS:
            _check_int(where, key, value)
        elif key in _FLOATS:
            out[key] = _check_float(where, key, value)
        elif key in _STRINGS or key in ("answer_column", "system_prompt"):
            nullable = key in ("split", "dataset_config", "answer_column", "system_prompt")
            if not (isinstance(value, str) and value.strip()) and not (nullable and value is None):
                raise ConfigError(f"{where}: {key}: {value!r} is invalid (text); fix {key}")
    return out


def _check_settings(where: str, bench: Benchmark) -> None:
    """Rules between fields: sampling, pass@k, ranges."""
    if bench.temperature < 0:
        raise ConfigError(f"{where}: temperature: {bench.temperature} must be >= 0 (0: greedy)")
    if not 0 < bench.top_p <= 1:
        raise ConfigError(f"{where}: top_p: {bench.top_p} must be in (0, 1]; e.g. 1.0")
    if bench.k > bench.num_samples:
        raise ConfigError(
            f"{where}: k: {bench.k} > num_samples: {bench.num_samples}; pass@k needs at least "
            f"k samples per prompt: set num_samples: {bench.k} or k <= {bench.num_samples}"
        )
    if bench.num_samples > 1 and bench.greedy:
        raise ConfigError(
            f"{where}: num_samples: {bench.num_samples} with temperature 0 (greedy) gives "
            "identical samples; set temperature > 0 (e.g. 1.0) or num_samples: 1"
        )
    if bench.dataset.startswith("builtin:") and bench.split not in ("train", "test"):
        raise ConfigError(
            f"{where}: split: {bench.split!r}: a built-in dataset has 'test' (held out from "
            "the training rows) and 'train' (the training rows); use one of them"
        )


def _from_mapping(index: int, entry: dict[str, Any]) -> Benchmark:
    name = entry.get("name")
    where = _where(index, name)
    for key in entry:
        if key not in FIELDS:
            raise ConfigError(f"{where}: unknown field {key!r}; {_closest(str(key), FIELDS)}")
    entry = _check_types(where, entry)
    if name is None:
        raise ConfigError(f"{where}: no name; give each benchmark a name, e.g. name: my_bench")
    base = BUILTIN_BENCHMARKS.get(name) if "dataset" not in entry else None
    if base is None and "dataset" not in entry:
        raise ConfigError(
            f"{where}: no dataset; set dataset (builtin:NAME, a local file or a hub id) or use "
            f"a built-in name ({', '.join(BUILTIN_BENCHMARKS)})"
        )
    bench = replace(base, **entry) if base is not None else Benchmark(**entry)
    if base is None and bench.dataset.startswith("builtin:") and "num_examples" not in entry:
        bench = replace(bench, num_examples=200)
    if bench.split is None:
        local = source_kind(bench.dataset) == "local"
        bench = replace(bench, split="train" if local else "test")
    _check_settings(where, bench)
    return bench


def _one(index: int, entry: Any) -> Benchmark:
    if isinstance(entry, str):
        if entry in BUILTIN_BENCHMARKS:
            return BUILTIN_BENCHMARKS[entry]
        raise ConfigError(
            f"{_where(index)}: unknown benchmark {entry!r}; use a built-in name "
            f"({', '.join(BUILTIN_BENCHMARKS)}) or a mapping {{name, dataset, ...}}"
        )
    if isinstance(entry, dict):
        return _from_mapping(index, entry)
    raise ConfigError(
        f"{_where(index)}: {entry!r} is invalid; give a built-in name or a mapping "
        "{name, dataset, split, prompt_column, answer_column, reward, num_samples, k, ...}"
    )


def parse_benchmarks(raw: Any, system_prompt: str | None = None) -> list[Benchmark]:
    """The recipe's `benchmarks` as Benchmarks (an empty list when unset); one-line errors.

    system_prompt: the recipe's, given to every benchmark that sets none of its own.
    """
    if raw is None:
        return []
    if not isinstance(raw, (list, tuple)):
        raise ConfigError(f"benchmarks: {raw!r} is invalid; give a list, e.g. [arithmetic]")
    benches, seen = [], set()
    for index, entry in enumerate(raw):
        bench = _one(index, entry)
        if not _NAME_RE.match(bench.name):
            raise ConfigError(
                f"{_where(index)}: name {bench.name!r}: use letters, digits, '_', '.', '-' "
                "(it names files and W&B keys)"
            )
        if bench.name in seen:
            raise ConfigError(f"{_where(index, bench.name)}: the name is used twice; rename one")
        seen.add(bench.name)
        if bench.system_prompt is _UNSET:
            bench = replace(bench, system_prompt=system_prompt)
        benches.append(bench)
    return benches


def select(benches: list[Benchmark], names: list[str] | None) -> list[Benchmark]:
    """The benchmarks named (all when names is empty); an unknown name is a one-line error."""
    if not names:
        return benches
    known = {b.name: b for b in benches}
    for name in names:
        if name not in known:
            valid = ", ".join(known) or "none: the recipe sets no benchmarks"
            raise ConfigError(f"--benchmark {name}: not a benchmark of the recipe ({valid})")
    return [known[name] for name in dict.fromkeys(names)]
