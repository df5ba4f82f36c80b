"""What a dataset name addresses (a built-in dataset, local files or a hub id), and which files
of a local source are its data.

No `datasets` import here: the launcher classifies a recipe's sources and finds their files
before any trainer starts (launch/local_data.py), and data/load.py loads them with the same
rules and the same messages.
"""

from __future__ import annotations

from pathlib import Path

from maxent_grpo.data.errors import DataError

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


def local_files(path: str, where: str) -> tuple[str, list[str]]:
    """The `datasets` builder name and the data files of a local file or directory (DataError:
    missing, no data files, mixed formats, all empty)."""
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
