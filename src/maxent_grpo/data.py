"""Training data: built-in offline datasets, dataset mixtures, and TRL conversational format.

Everything a recipe can get wrong about its data surfaces as a one-line `DataError` that names
the offending key or column and the fix, ideally from `preflight_columns` before a job is queued.
Sources are addressed as a hub id (`org/name`), `builtin:NAME` (generated, no network), or a
local file/directory (.jsonl .json .parquet .csv). `load_datasets` returns a `DatasetDict` with
the keys `train` and, when a test split exists, `test`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from maxent_grpo.errors import UserError

BUILTIN_PREFIX = "builtin:"
BUILTIN_NAMES = ("arithmetic", "word_problems", "mixed")
BUILTIN_COLUMNS = ("problem", "solution")
LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
ANSWER_COLUMN_OUT = "solution"  # reward functions receive the reference answer as `solution=`


class DataError(UserError):
    """A user error in the data configuration; the message is one line: what is wrong, the fix."""


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


# --------------------------------------------------------------------------------------------
# Built-in datasets: generated from a seed so smoke tests and tutorials need no network.
# --------------------------------------------------------------------------------------------

_NAMES = ("Ada", "Ben", "Chloe", "Dev", "Emma", "Hugo", "Iris", "Kira", "Liam", "Maya", "Noah")


def _arithmetic_problem(rng: random.Random) -> tuple[str, int]:
    """An expression over 2-4 small non-negative integers with +, -, * and maybe one (...) pair.

    Resampled until the answer is non-negative, so answers stay easy to parse and verify.
    """
    while True:
        terms = [str(rng.randint(0, 20)) for _ in range(rng.randint(2, 4))]
        ops = [rng.choice("+-*") for _ in range(len(terms) - 1)]
        if len(terms) >= 3 and rng.random() < 0.4:
            i = rng.randrange(len(terms) - 1)
            terms[i : i + 2] = [f"({terms[i]} {ops.pop(i)} {terms[i + 1]})"]
        expr = " ".join(t for pair in zip(terms, ops + [""]) for t in pair if t)
        answer = _evaluate(expr)
        if answer >= 0:
            return f"What is {expr}?", answer


def _evaluate(expr: str) -> int:
    """Exact value of a generated expression: parenthesised groups first, then * before +/-."""
    while "(" in expr:
        start = expr.rindex("(")
        end = expr.index(")", start)
        expr = f"{expr[:start]}{_evaluate(expr[start + 1 : end])}{expr[end + 1 :]}"
    total, sign, product = 0, 1, None
    tokens = expr.split()
    for i in range(0, len(tokens), 2):
        value = int(tokens[i])
        product = value if product is None else product * value
        op = tokens[i + 1] if i + 1 < len(tokens) else "+"
        if op != "*":
            total, sign, product = total + sign * product, (1 if op == "+" else -1), None
    return total


def _word_problem(rng: random.Random) -> tuple[str, int]:
    """One of a few templates with random names and numbers; every answer is an integer >= 0."""
    name, friend = rng.sample(_NAMES, 2)
    kind = rng.randrange(6)
    if kind == 0:
        have, bought = rng.randint(2, 30), rng.randint(1, 30)
        given = rng.randint(0, have + bought)
        text = (
            f"{name} has {have} apples, buys {bought} more and gives {given} to {friend}. "
            f"How many apples does {name} have left?"
        )
        return text, have + bought - given
    if kind == 1:
        speed, hours = rng.randint(20, 120), rng.randint(1, 9)
        text = (
            f"A train leaves {name}'s town and travels at {speed} km per hour for {hours} hours. "
            "How many kilometers does it travel?"
        )
        return text, speed * hours
    if kind == 2:
        boxes, per_box = rng.randint(2, 12), rng.randint(3, 24)
        given = rng.randint(0, boxes * per_box)
        text = (
            f"{name} buys {boxes} boxes of pencils with {per_box} pencils in each box and gives "
            f"{given} pencils to {friend}. How many pencils does {name} have left?"
        )
        return text, boxes * per_box - given
    if kind == 3:
        weekly, weeks = rng.randint(1, 25), rng.randint(2, 12)
        spent = rng.randint(0, weekly * weeks)
        text = (
            f"{name} saves {weekly} dollars every week for {weeks} weeks and then spends {spent} "
            f"dollars on a book. How many dollars does {name} have left?"
        )
        return text, weekly * weeks - spent
    if kind == 4:
        friends, each = rng.randint(2, 9), rng.randint(1, 15)
        text = (
            f"{name} shares {friends * each} cookies equally among {friends} friends. "
            "How many cookies does each friend get?"
        )
        return text, each
    age, older, years = rng.randint(5, 40), rng.randint(1, 20), rng.randint(1, 15)
    text = (
        f"{name} is {age} years old and {friend} is {older} years older than {name}. "
        f"How old will {friend} be in {years} years?"
    )
    return text, age + older + years


def builtin_dataset(name: str, num_rows: int = 4096, seed: int = 0) -> datasets.Dataset:
    """Generate `builtin:NAME` rows (`problem`, `solution`) deterministically from `seed`."""
    if name not in BUILTIN_NAMES:
        raise DataError(
            f"unknown builtin dataset {name!r}; use one of: "
            + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_NAMES)
        )
    if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1:
        raise DataError(f"dataset_num_rows: must be an integer >= 1 (got {num_rows!r}); e.g. 4096")
    rng = random.Random(seed)
    problems, solutions = [], []
    for _ in range(num_rows):
        word = name == "word_problems" or (name == "mixed" and rng.random() < 0.5)
        problem, answer = _word_problem(rng) if word else _arithmetic_problem(rng)
        problems.append(problem)
        solutions.append(str(answer))
    return datasets.Dataset.from_dict({"problem": problems, "solution": solutions})


# --------------------------------------------------------------------------------------------
# Mixture parsing: validate the raw recipe dict once, so loading code can trust its input.
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# Loading one source.
# --------------------------------------------------------------------------------------------


def source_kind(name: str, is_path: bool = False) -> str:
    """Classify a dataset name as builtin, local or hub (`is_path`: it is a mixture `path`).

    A known file suffix, an explicit path prefix or an existing path means local; anything else
    (typically `org/name`) is a hub id.
    """
    if is_path:
        return "local"
    if name.startswith(BUILTIN_PREFIX):
        return "builtin"
    local = (
        Path(name).suffix.lower() in LOCAL_FORMATS
        or name.startswith(("/", "./", "../", "~"))
        or Path(name).expanduser().exists()
    )
    return "local" if local else "hub"


def local_files(path: str, where: str) -> tuple[str, list[str]]:
    """The `datasets` builder name and the data files of a local file or directory."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"{where}: {path} does not exist; fix the path (relative to {Path.cwd()})")
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    files = [f for f in files if f.suffix.lower() in LOCAL_FORMATS]
    if not files:
        suffixes = " ".join(LOCAL_FORMATS)
        raise DataError(f"{where}: no data files in {path}; use files ending in {suffixes}")
    builders = sorted({LOCAL_FORMATS[f.suffix.lower()] for f in files})
    if len(builders) > 1:
        raise DataError(
            f"{where}: {path} mixes formats ({', '.join(builders)}); "
            "keep one format per directory or list the files as separate mixture entries"
        )
    if all(f.stat().st_size == 0 for f in files):
        raise DataError(f"{where}: {path} is empty (0 rows); add rows or use another dataset")
    return builders[0], [str(f) for f in files]


def load_local(path: str, where: str) -> datasets.Dataset:
    """Load a local file/directory as its one split, `train`."""
    builder, files = local_files(path, where)
    try:
        return datasets.load_dataset(builder, data_files=files, split="train")
    except (StopIteration, ValueError, datasets.exceptions.DatasetGenerationError) as err:
        # `datasets` reports empty and malformed files with assorted exception types.
        cause = err.__cause__ or err  # DatasetGenerationError hides the reason in its cause
        reason = (str(cause).splitlines() or ["no rows"])[0]
        raise DataError(
            f"{where}: cannot read {path} as {builder} ({type(cause).__name__}: {reason}); "
            f"make it a non-empty, valid {builder} file"
        ) from err


def load_source(
    name: str,
    config: str | None = None,
    split: str = "train",
    *,
    is_path: bool = False,
    num_rows: int = 4096,
    seed: int = 0,
    where: str = "dataset_name",
) -> datasets.Dataset:
    """Load one split of a builtin, local or hub source; a source with no rows is an error."""
    kind = source_kind(name, is_path)
    if kind == "builtin":
        dataset = builtin_dataset(name[len(BUILTIN_PREFIX) :], num_rows=num_rows, seed=seed)
    elif kind == "local":
        dataset = load_local(name, where)
    else:
        dataset = datasets.load_dataset(name, config, split=split)
    if len(dataset) == 0:
        raise DataError(f"{where}: {name} has 0 rows; add rows or use another dataset")
    return dataset


# --------------------------------------------------------------------------------------------
# Columns and conversational format.
# --------------------------------------------------------------------------------------------

MESSAGES_FEATURE = datasets.List(
    {"role": datasets.Value("string"), "content": datasets.Value("string")}
)
COLUMNS_FIX = "set dataset_prompt_column / dataset_answer_column (or the mixture 'columns')"


def check_columns(
    available: Iterable[str],
    required: Iterable[str | None],
    dataset: str,
    where: str,
    fix: str = COLUMNS_FIX,
) -> None:
    """Raise if a required column (None entries are skipped) is not among `available`."""
    available = list(available)
    for column in required:
        if column is not None and column not in available:
            raise DataError(
                f"{where}: column {column!r} not in {dataset} "
                f"(columns: {', '.join(available)}); {fix}"
            )


def _messages(value: Any, system_prompt: str | None) -> list[dict] | None:
    """Chat messages for one prompt (text becomes a user turn; message lists are kept)."""
    if isinstance(value, str) and value.strip():
        messages = [{"role": "user", "content": value}]
    elif isinstance(value, list) and value:
        messages = [{"role": m["role"], "content": m["content"]} for m in value]
    else:
        return None
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def to_conversation(
    dataset: datasets.Dataset,
    prompt_column: str = "problem",
    answer_column: str | None = "solution",
    system_prompt: str | None = None,
    *,
    name: str = "the dataset",
    where: str = "dataset_name",
) -> datasets.Dataset:
    """Map rows to TRL's conversational `prompt` plus a str `solution` (the reward kwarg).

    The prompt column is dropped; other columns are kept. `answer_column=None` adds no solution.
    """
    check_columns(dataset.column_names, [prompt_column, answer_column], name, where)

    def convert(row: dict, index: int) -> dict:
        prompt = _messages(row[prompt_column], system_prompt)
        if prompt is None:
            raise DataError(
                f"{where}: row {index} of {name} has prompt {row[prompt_column]!r} in column "
                f"{prompt_column!r}; it must be non-empty text, so filter such rows out"
            )
        if answer_column is None:
            return {"prompt": prompt}
        if row[answer_column] is None:
            raise DataError(
                f"{where}: row {index} of {name} has no {answer_column!r}; "
                "filter such rows out or set dataset_answer_column: null"
            )
        return {"prompt": prompt, ANSWER_COLUMN_OUT: str(row[answer_column])}

    # Explicit output types: `datasets` would otherwise cast a replaced column back to its old
    # type (e.g. the str answers of an int `solution` column back to int).
    new = {"prompt": MESSAGES_FEATURE}
    if answer_column is not None:
        new[ANSWER_COLUMN_OUT] = datasets.Value("string")
    remove = [c for c in dataset.column_names if c in new or c == prompt_column]
    kept = {c: f for c, f in dataset.features.items() if c not in remove}
    features = datasets.Features({**kept, **new})
    return dataset.map(convert, with_indices=True, remove_columns=remove, features=features)


# --------------------------------------------------------------------------------------------
# Mixtures.
# --------------------------------------------------------------------------------------------


def entry_name(entry: MixtureEntry) -> str:
    """How an entry is named in messages: its id or its path."""
    return entry.id if entry.id is not None else entry.path


def select_columns(dataset: datasets.Dataset, entry: MixtureEntry, where: str) -> datasets.Dataset:
    """Keep only the entry's `columns`, so sources with extra columns can be concatenated."""
    if entry.columns is None:
        return dataset
    fix = "set 'columns' or the prompt column"
    check_columns(dataset.column_names, entry.columns, entry_name(entry), where, fix)
    return dataset.select_columns(list(entry.columns))


def subsample(dataset: datasets.Dataset, weight: float, seed: int) -> datasets.Dataset:
    """Keep round(weight * n) rows (at least one), chosen by a seeded shuffle."""
    keep = max(1, round(weight * len(dataset)))
    if keep >= len(dataset):
        return dataset
    return dataset.shuffle(seed=seed).select(range(keep))


def check_same_features(parts: Sequence[datasets.Dataset]) -> None:
    """Concatenation needs identical columns and types; say which entry differs and how."""
    first = parts[0].features
    for i, part in enumerate(parts[1:], start=1):
        if part.features == first:
            continue
        where = f"dataset_mixture.datasets[{i}]"
        if set(part.column_names) != set(first):
            raise DataError(
                f"{where}: columns ({', '.join(part.column_names)}) differ from datasets[0] "
                f"({', '.join(first)}); set the same 'columns' on every entry"
            )
        column = next(c for c in first if part.features[c] != first[c])
        raise DataError(
            f"{where}: column {column!r} has type {part.features[column]} but datasets[0] has "
            f"{first[column]}; leave it out of 'columns' or make the files agree"
        )


def carve_test_split(
    dataset: datasets.Dataset, size: float, seed: int
) -> dict[str, datasets.Dataset]:
    """Hold out `size` of the mixed rows as `test`; both splits must keep at least one row."""
    n_test = math.ceil(size * len(dataset))  # how train_test_split rounds a fractional size
    if n_test < 1 or n_test >= len(dataset):
        raise DataError(
            f"dataset_mixture.test_split_size: {size} of {len(dataset)} rows leaves an empty "
            "split; use more rows or another test_split_size"
        )
    split = dataset.train_test_split(test_size=size, seed=seed)
    return {"train": split["train"], "test": split["test"]}


def load_mixture(mixture: DatasetMixture, args: Any) -> dict[str, datasets.Dataset]:
    """Load, select, convert and weight each entry; concatenate, shuffle and maybe split.

    Entries are converted before concatenating so that e.g. int and str answers agree.
    """
    parts = []
    for i, entry in enumerate(mixture.datasets):
        where = f"dataset_mixture.datasets[{i}]"
        name = entry_name(entry)
        dataset = load_source(
            name,
            entry.config,
            entry.split,
            is_path=entry.path is not None,
            num_rows=getattr(args, "dataset_num_rows", 4096),
            seed=getattr(args, "dataset_seed", 0),
            where=where,
        )
        dataset = select_columns(dataset, entry, where)
        dataset = _convert(dataset, args, name=name, where=where)
        parts.append(subsample(dataset, entry.weight, mixture.seed))
    check_same_features(parts)
    mixed = datasets.concatenate_datasets(parts).shuffle(seed=mixture.seed)
    if not mixture.test_split_size:
        return {"train": mixed}
    return carve_test_split(mixed, mixture.test_split_size, mixture.seed)


# --------------------------------------------------------------------------------------------
# Entry points.
# --------------------------------------------------------------------------------------------


def _convert(dataset: datasets.Dataset, args: Any, *, name: str, where: str) -> datasets.Dataset:
    """`to_conversation` with the recipe's column and system-prompt settings."""
    return to_conversation(
        dataset,
        getattr(args, "dataset_prompt_column", "problem"),
        getattr(args, "dataset_answer_column", "solution"),
        getattr(args, "system_prompt", None),
        name=name,
        where=where,
    )


def check_source(args: Any) -> None:
    """Exactly one of dataset_name / dataset_mixture; builtin/local sources only have `train`."""
    name = getattr(args, "dataset_name", None)
    mixture = getattr(args, "dataset_mixture", None)
    if (name is None) == (mixture is None):
        state = "both are set" if name is not None else "neither is set"
        raise DataError(
            f"dataset_name / dataset_mixture: exactly one is required ({state}); "
            "set dataset_name (hub id, builtin:NAME or local path) or dataset_mixture"
        )
    if mixture is not None and not isinstance(mixture, DatasetMixture):
        raise DataError(
            f"dataset_mixture: expected a parsed DatasetMixture (got {type(mixture).__name__}); "
            "pass the recipe's mapping through parse_mixture() first"
        )
    if mixture is not None or source_kind(name) == "hub":
        return
    train = getattr(args, "dataset_train_split", "train")
    test = getattr(args, "dataset_test_split", None)
    if train != "train" or test is not None:
        raise DataError(
            f"dataset_train_split / dataset_test_split: {name} only has a 'train' split "
            f"(got {train!r} / {test!r}); set them to train / null, "
            "or use dataset_mixture with test_split_size"
        )


def load_datasets(args: Any) -> datasets.DatasetDict:
    """The recipe's data, TRL-formatted, as a DatasetDict with `train` (and `test` if any)."""
    check_source(args)
    if getattr(args, "dataset_mixture", None) is not None:
        return datasets.DatasetDict(load_mixture(args.dataset_mixture, args))
    name = args.dataset_name
    splits = {"train": getattr(args, "dataset_train_split", "train")}
    if getattr(args, "dataset_test_split", None) is not None:
        splits["test"] = args.dataset_test_split
    out = {}
    for key, split in splits.items():
        where = "dataset_name" if key == "train" else "dataset_test_split"
        dataset = load_source(
            name,
            getattr(args, "dataset_config", None),
            split,
            num_rows=getattr(args, "dataset_num_rows", 4096),
            seed=getattr(args, "dataset_seed", 0),
            where=where,
        )
        out[key] = _convert(dataset, args, name=f"{name} [{split}]", where=where)
    return datasets.DatasetDict(out)


def _preflight_sources(args: Any) -> list[tuple[str, str, str, tuple[str, ...] | None]]:
    """(name, key path, kind, kept columns) for every source the recipe names."""
    mixture = getattr(args, "dataset_mixture", None)
    if mixture is None:
        return [(args.dataset_name, "dataset_name", source_kind(args.dataset_name), None)]
    return [
        (
            entry_name(e),
            f"dataset_mixture.datasets[{i}]",
            source_kind(entry_name(e), e.path is not None),
            e.columns,
        )
        for i, e in enumerate(mixture.datasets)
    ]


def preflight_columns(args: Any) -> None:
    """Check the columns of builtin and local sources before a job is queued; never the hub.

    Builtin columns are known without generating rows. Local files are loaded, which also fills
    the `datasets` cache that training then reuses.
    """
    check_source(args)
    required = [
        getattr(args, "dataset_prompt_column", "problem"),
        getattr(args, "dataset_answer_column", "solution"),
    ]
    for name, where, kind, kept in _preflight_sources(args):
        if kind == "hub":
            continue  # checked when training loads it
        columns = (
            list(BUILTIN_COLUMNS)
            if kind == "builtin"
            else load_source(name, is_path=True, where=where).column_names
        )
        if kept is not None:
            check_columns(columns, kept, name, where, "set 'columns' or the prompt column")
            columns = list(kept)
        check_columns(columns, required, name, where)
