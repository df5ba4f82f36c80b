"""What a dataset name addresses: a built-in dataset, local files or a hub id.

No `datasets` import here: the launcher classifies a recipe's sources before any trainer
starts (launch/local_data.py), and data/load.py loads them with the same rules.
"""

from __future__ import annotations

from pathlib import Path

BUILTIN_PREFIX = "builtin:"
#: The file suffixes of local data and the `datasets` builder that reads each.
LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


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
