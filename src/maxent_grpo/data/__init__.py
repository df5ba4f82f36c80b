"""Training data: built-in offline datasets, dataset mixtures, and TRL conversational format.

Everything a recipe can get wrong about its data surfaces as a one-line `DataError` that names
the offending key or column and the fix, ideally from `preflight_columns` before a job is queued.
Sources are addressed as a hub id (`org/name`), `builtin:NAME` (generated, no network), or a
local file/directory (.jsonl .json .parquet .csv). `load_datasets` returns a `DatasetDict` with
the keys `train` and, when a test split exists, `test`.

Modules: `sources` (what a name addresses; no `datasets` import), `builtin` (generated
datasets), `mixture` (the `dataset_mixture` schema), `load`
(sources, columns, conversion, preflight), `prompt_template` (plain-text prompts). They read
the recipe's `ScriptArguments` attributes directly: the defaults live in the dataclass only.
"""

import importlib

# Loaded on first use: `datasets` takes seconds to import, and the launcher needs only
# `sources` (what a name addresses) before any trainer starts.
_HOMES = {
    "BUILTIN_COLUMNS": "builtin",
    "BUILTIN_NAMES": "builtin",
    "builtin_dataset": "builtin",
    "DataError": "errors",
    "load_datasets": "load",
    "preflight_columns": "load",
    "subsample": "load",
    "to_conversation": "load",
    "DatasetMixture": "mixture",
    "MixtureEntry": "mixture",
    "parse_mixture": "mixture",
    "NAMED_TEMPLATES": "prompt_template",
    "check_prompt_template": "prompt_template",
    "BUILTIN_PREFIX": "sources",
    "LOCAL_FORMATS": "sources",
    "source_kind": "sources",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
