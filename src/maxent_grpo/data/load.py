"""Loading the recipe's data: sources, columns, TRL's conversational format, mixtures, preflight."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import datasets

from maxent_grpo.data.builtin import BUILTIN_COLUMNS, builtin_dataset
from maxent_grpo.data.errors import DataError
from maxent_grpo.data.mixture import DatasetMixture, MixtureEntry
from maxent_grpo.data.prompt_template import render, resolve_template
from maxent_grpo.data.sources import BUILTIN_PREFIX, local_files, source_kind
from maxent_grpo.errors import ConfigError
from maxent_grpo.recipe.checks import check_dataset_source

ANSWER_COLUMN_OUT = "solution"  # reward functions receive the reference answer as `solution=`


# --------------------------------------------------------------------------------------------
# Loading one source.
# --------------------------------------------------------------------------------------------


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
    num_rows: int,
    seed: int,
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
    """Raise if a required column (None entries are skipped) is not among `available`.

    A dotted name (`reward_model.ground_truth`, verl's layout) is a field of a struct column:
    its column must be there (the field is read row by row, `cell`)."""
    available = list(available)
    for column in required:
        if column is not None and column not in available and column.split(".")[0] not in available:
            raise DataError(
                f"{where}: column {column!r} not in {dataset} "
                f"(columns: {', '.join(available)}); {fix}"
            )


def cell(row: Mapping, column: str) -> Any:
    """The row's value of `column`, or of a struct column's field (`a.b`: row["a"]["b"])."""
    if column in row:
        return row[column]
    value: Any = row
    for part in column.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


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
    prompt_column: str,
    answer_column: str | None,
    system_prompt: str | None,
    *,
    name: str = "the dataset",
    where: str = "dataset_name",
    prompt_template: str | None = None,
) -> datasets.Dataset:
    """Map rows to TRL's conversational `prompt` plus a str `solution` (the reward kwarg).

    With a `prompt_template` (data/prompt_template.py) the prompt is that template's plain
    text instead. The prompt column is dropped; other columns are kept. `answer_column=None`
    adds no solution.
    """
    check_columns(dataset.column_names, [prompt_column, answer_column], name, where)
    template = None if prompt_template is None else resolve_template(prompt_template, system_prompt)

    def convert(row: dict, index: int) -> dict:
        value = row[prompt_column]
        if template is not None and isinstance(value, str) and value.strip():
            prompt = render(template, value, system_prompt)
        elif template is None:
            prompt = _messages(value, system_prompt)
        else:
            prompt = None  # a template needs the prompt's text, not a list of messages
        if prompt is None:
            raise DataError(
                f"{where}: row {index} of {name} has prompt {value!r} in column "
                f"{prompt_column!r}; it must be non-empty text, so filter such rows out"
            )
        if answer_column is None:
            return {"prompt": prompt}
        answer = cell(row, answer_column)
        if answer is None:
            raise DataError(
                f"{where}: row {index} of {name} has no {answer_column!r}; "
                "filter such rows out or set dataset_answer_column: null"
            )
        return {"prompt": prompt, ANSWER_COLUMN_OUT: str(answer)}

    # Explicit output types: `datasets` would otherwise cast a replaced column back to its old
    # type (e.g. the str answers of an int `solution` column back to int).
    new = {"prompt": MESSAGES_FEATURE if template is None else datasets.Value("string")}
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
            num_rows=args.dataset_num_rows,
            seed=args.dataset_seed,
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
        args.dataset_prompt_column,
        args.dataset_answer_column,
        args.system_prompt,
        name=name,
        where=where,
        prompt_template=args.prompt_template,
    )


def check_source(args: Any) -> None:
    """Exactly one of dataset_name / dataset_mixture; builtin/local sources only have `train`."""
    name = args.dataset_name
    mixture = args.dataset_mixture
    try:
        check_dataset_source(name, mixture)  # the launcher's rule (recipe/checks.py)
    except ConfigError as exc:
        raise DataError(str(exc)) from None
    if mixture is not None and not isinstance(mixture, DatasetMixture):
        raise DataError(
            f"dataset_mixture: expected a parsed DatasetMixture (got {type(mixture).__name__}); "
            "pass the recipe's mapping through parse_mixture() first"
        )
    if mixture is not None or source_kind(name) == "hub":
        return
    train = args.dataset_train_split
    test = args.dataset_test_split
    if train != "train" or test is not None:
        raise DataError(
            f"dataset_train_split / dataset_test_split: {name} only has a 'train' split "
            f"(got {train!r} / {test!r}); set them to train / null, "
            "or use dataset_mixture with test_split_size"
        )


def load_datasets(args: Any) -> datasets.DatasetDict:
    """The recipe's data, TRL-formatted, as a DatasetDict with `train` (and `test` if any)."""
    check_source(args)
    if args.dataset_mixture is not None:
        return datasets.DatasetDict(load_mixture(args.dataset_mixture, args))
    name = args.dataset_name
    splits = {"train": args.dataset_train_split}
    if args.dataset_test_split is not None:
        splits["test"] = args.dataset_test_split
    out = {}
    for key, split in splits.items():
        where = "dataset_name" if key == "train" else "dataset_test_split"
        dataset = load_source(
            name,
            args.dataset_config,
            split,
            num_rows=args.dataset_num_rows,
            seed=args.dataset_seed,
            where=where,
        )
        out[key] = _convert(dataset, args, name=f"{name} [{split}]", where=where)
    return datasets.DatasetDict(out)


def _preflight_sources(args: Any) -> list[tuple[str, str, str, tuple[str, ...] | None]]:
    """(name, key path, kind, kept columns) for every source the recipe names."""
    mixture = args.dataset_mixture
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
    required = [args.dataset_prompt_column, args.dataset_answer_column]
    for name, where, kind, kept in _preflight_sources(args):
        if kind == "hub":
            continue  # checked when training loads it
        columns = (
            list(BUILTIN_COLUMNS)
            if kind == "builtin"
            else load_source(
                name,
                is_path=True,
                num_rows=args.dataset_num_rows,
                seed=args.dataset_seed,
                where=where,
            ).column_names
        )
        if kept is not None:
            check_columns(columns, kept, name, where, "set 'columns' or the prompt column")
            columns = list(kept)
        check_columns(columns, required, name, where)
