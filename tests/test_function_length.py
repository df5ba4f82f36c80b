"""No function or method in src/ longer than MAX_LINES (issue 50): a longer one is split along
its seams into named helpers that say what each part decides. Read from the source with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 60  # from the `def` line (decorators not counted) to the last line of the body


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    """'path:line name (N lines)' for each function under `root` longer than `limit`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    where = path.relative_to(root.parent)
                    found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_src_is_longer_than_60_lines():
    assert long_functions(SRC) == []


def test_a_long_function_is_found(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_LINES))  # def + 60 lines: 61
    (tmp_path / "pkg").mkdir()
    module = tmp_path / "pkg" / "mod.py"
    module.write_text(f"def short():\n    return 1\n\n\nclass C:\n    def long(self):\n{body}")
    assert long_functions(tmp_path / "pkg") == [f"pkg/mod.py:6 long ({MAX_LINES + 1} lines)"]
    module.write_text(f"class C:\n    def fits(self):\n{body[: body.rindex('        x')]}")
    assert long_functions(tmp_path / "pkg") == []
