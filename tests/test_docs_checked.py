"""The docs say what the code does: every block marked `<!-- checked -->` is run.

A checked block is a ```text (or console/bash) fence right after the marker line. Its `$ `
lines are commands, run from the repository root (on CPU, in this venv); the lines after a
command are an excerpt of what it prints (stdout and stderr): each must appear, whole and in
order, among its output lines. A `...` line stands for any lines. Pick cheap commands (check,
plan, migrate, runs, --help): the whole page set runs in seconds.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.runs import child_env

DOCS = REPO / "docs"
PAGES = sorted([*DOCS.glob("*.md"), REPO / "README.md"])
MARKER = "<!-- checked -->"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    command: str
    excerpt: tuple[str, ...]


def examples(path: Path) -> list[Example]:
    """The commands of a page's checked blocks, each with the excerpt shown after it."""
    lines = path.read_text().splitlines()
    found: list[Example] = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        assert lines[i + 1].startswith("```"), f"{path.name}:{i + 1}: {MARKER} before no fence"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        command, excerpt, start = None, [], i + 2
        for j in range(i + 2, end + 1):
            text = lines[j] if j < end else "$ "
            if text.startswith("$ "):
                if command is not None:
                    found.append(Example(path.name, start + 1, command, tuple(excerpt)))
                command, excerpt, start = text[2:], [], j
            elif command is not None and text.strip():
                excerpt.append(text.rstrip())
    return found


def mismatch(excerpt: tuple[str, ...], output: str) -> str | None:
    """None when each excerpt line is an output line, in order; else the first one missing."""
    printed = [line.rstrip() for line in output.splitlines()]
    at = 0
    for wanted in excerpt:
        if wanted == "...":
            continue
        try:
            at = printed.index(wanted, at) + 1
        except ValueError:
            return wanted
    return None


def run_example(example: Example) -> str:
    result = subprocess.run(
        ["bash", "-c", example.command],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stdout + result.stderr


ALL = [e for page in PAGES for e in examples(page)]


def test_pages_have_checked_examples():
    assert len(ALL) >= 2 and {e.page for e in ALL} >= {"getting-started.md"}


@pytest.mark.parametrize("example", ALL, ids=lambda e: f"{e.page}:{e.line}")
def test_a_checked_example_prints_what_the_page_shows(example):
    output = run_example(example)
    missing = mismatch(example.excerpt, output)
    assert missing is None, (
        f"{example.page}:{example.line}: `{example.command}` did not print\n  {missing}\n"
        f"it printed:\n{output[-3000:]}"
    )


def test_a_wrong_excerpt_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Intro.\n\n<!-- checked -->\n```text\n$ echo one; echo two\none\n...\nthree\n```\n"
    )
    (example,) = examples(page)
    assert example.excerpt == ("one", "...", "three")
    assert mismatch(example.excerpt, run_example(example)) == "three"
    assert mismatch(("one", "...", "two"), run_example(example)) is None
    assert mismatch(("two", "one"), "one\ntwo\n") == "one"  # order counts


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")) + [REPO / "README.md"], ids=str)
def test_no_control_characters_in_docs(page):
    for number, line in enumerate(page.read_text().splitlines(), 1):
        assert not CONTROL.search(line), f"{page.name}:{number}: control character: {line!r}"
