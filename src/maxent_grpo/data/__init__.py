"""Training data: built-in offline datasets, dataset mixtures, and TRL conversational format.

Everything a recipe can get wrong about its data surfaces as a one-line `DataError` that names
the offending key or column and the fix, ideally from `preflight_columns` before a job is queued.
Sources are addressed as a hub id (`org/name`), `builtin:NAME` (generated, no network), or a
local file/directory (.jsonl .json .parquet .csv). `load_datasets` returns a `DatasetDict` with
the keys `train` and, when a test split exists, `test`.

Modules: `builtin` (generated datasets), `mixture` (the `dataset_mixture` schema), `load`
(sources, columns, conversion, preflight), `prompt_template` (plain-text prompts). They read
the recipe's `ScriptArguments` attributes directly: the defaults live in the dataclass only.
"""

from maxent_grpo.data.builtin import (
    BUILTIN_COLUMNS,
    BUILTIN_NAMES,
    BUILTIN_PREFIX,
    builtin_dataset,
)
from maxent_grpo.data.errors import (
    DataError,
)
from maxent_grpo.data.load import (
    load_datasets,
    preflight_columns,
    source_kind,
    subsample,
    to_conversation,
)
from maxent_grpo.data.mixture import (
    DatasetMixture,
    MixtureEntry,
    parse_mixture,
)
from maxent_grpo.data.prompt_template import (
    NAMED_TEMPLATES,
    check_prompt_template,
)

__all__ = [
    "BUILTIN_COLUMNS",
    "BUILTIN_NAMES",
    "BUILTIN_PREFIX",
    "builtin_dataset",
    "check_prompt_template",
    "DataError",
    "DatasetMixture",
    "load_datasets",
    "MixtureEntry",
    "NAMED_TEMPLATES",
    "parse_mixture",
    "preflight_columns",
    "source_kind",
    "subsample",
    "to_conversation",
]
