"""recipe/old_keys.json from the migration table: what the parser says of an old key.

python -m maxent_grpo.migrate.table --write    # after changing a row
python -m maxent_grpo.migrate.table            # exit 1 when the file is stale
"""

from __future__ import annotations

import json
import sys

from maxent_grpo.migrate import MIGRATIONS
from maxent_grpo.recipe.old_keys import TABLE


def table_text() -> str:
    """The file's text: one object per row, in the table's order."""
    rows = [
        {"key": m.key, "action": m.action, "origin": m.origin, "why": m.why, "target": m.target}
        for m in MIGRATIONS.values()
    ]
    return json.dumps(rows, indent=1) + "\n"


def main(argv: list[str]) -> int:
    text = table_text()
    if "--write" in argv:
        TABLE.write_text(text)
        return 0
    if TABLE.read_text() != text:
        print(f"{TABLE} is stale: run python -m maxent_grpo.migrate.table --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
