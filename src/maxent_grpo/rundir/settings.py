"""The settings a run was started with: `<output_dir>/run_settings.json`.

The launcher writes it at a run's first start (and again when a resume accepts changed
settings): the recipe file, the method, the command line's recipe overrides and every key's
effective value. A later start of the same output_dir lays those overrides under its own, so
a resume trains with the settings it started with unless told otherwise (launch/resume.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maxent_grpo.rundir.checkpoints import write_json_atomic

SETTINGS_FILE = "run_settings.json"


@dataclass(frozen=True)
class RunSettings:
    recipe: str
    method: str
    overrides: tuple[str, ...]  # the command line's recipe flags (after --), in order
    values: dict[str, Any]  # every key's effective value, as JSON holds it


def as_json_values(values) -> dict[str, Any]:
    """Values as they read back from the file (tuples as lists, paths as strings)."""
    return json.loads(json.dumps(dict(values), default=str))


def settings_path(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / SETTINGS_FILE


def read_settings(output_dir: str | os.PathLike) -> RunSettings | None:
    """The recorded settings, None when the run has none (or an unreadable file)."""
    try:
        data = json.loads(settings_path(output_dir).read_text())
        return RunSettings(
            str(data["recipe"]), str(data["method"]), tuple(data["overrides"]), data["values"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_settings(output_dir: str | os.PathLike, settings: RunSettings) -> None:
    path = settings_path(output_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        path,
        {
            "recipe": settings.recipe,
            "method": settings.method,
            "overrides": list(settings.overrides),
            "values": as_json_values(settings.values),
        },
    )
