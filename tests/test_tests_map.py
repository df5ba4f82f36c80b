"""tests/README.md maps each module of the package to its tests: keep the map true."""

from __future__ import annotations

import re

from helpers.paths import REPO

TESTS = REPO / "tests"
PACKAGE = REPO / "src" / "maxent_grpo"


def rows() -> list[tuple[str, str]]:
    text = (TESTS / "README.md").read_text()
    found = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[1].startswith("`"):
            found.append((cells[0], cells[1]))
    return found


def test_every_test_file_is_in_the_map_and_every_named_file_exists():
    named = {n for _, tests in rows() for n in re.findall(r"`([\w/]+\.py)`", tests)}
    on_disk = {str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")}
    assert sorted(on_disk - named) == [], "test files missing from tests/README.md"
    assert sorted(named - on_disk) == [], "tests/README.md names files that do not exist"


def test_every_package_and_top_level_module_has_a_row():
    modules = " ".join(module for module, _ in rows())
    wanted = [f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()]
    wanted += [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert sorted(m for m in wanted if f"`{m}" not in modules) == []


def test_no_two_test_files_share_a_name():
    """pytest imports test files by their base name (no __init__.py under tests/): a second
    file of the same name anywhere stops the whole collection."""
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
