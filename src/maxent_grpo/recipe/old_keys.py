"""Keys of other toolkits and older versions, as the parser needs them: who moved each one, why,
and the fix, read from old_keys.json.

The table itself is `maxent-grpo migrate`'s (maxent_grpo/migrate/, a package above this one:
reading a recipe never imports it); `python -m maxent_grpo.migrate.table --write` writes this
file from it and tests/test_migrate.py fails when it is stale.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("old_keys.json")


@dataclass(frozen=True)
class OldKey:
    """One key the parser does not know under this name (migrate/kinds.py Migration's words)."""

    key: str
    action: str  # rename | convert | alias | remove | fold
    origin: str
    why: str
    target: str | None = None

    def fix(self, value: Any = None) -> str:
        """The fix, for one line of `check`: 'use dtype: bfloat16 instead', 'delete it'."""
        if self.action == "remove":
            return "delete it"
        if self.action == "fold":
            return f"run maxent-grpo migrate: it folds the key into {self.target}"
        if self.action == "convert":
            return f"use {self.target} instead, with the value converted"
        shown = "..." if value is None or isinstance(value, (dict, list)) else value
        return f"use {self.target}: {shown} instead"


@cache
def old_keys() -> dict[str, OldKey]:
    """key -> its row (old_keys.json)."""
    rows = json.loads(TABLE.read_text())
    return {row["key"]: OldKey(**row) for row in rows}


@cache
def aliases() -> dict[str, str]:
    """alias -> the key it is read as."""
    return {k: row.target for k, row in old_keys().items() if row.action == "alias" and row.target}
