"""Docs that run: every `check`, `plan`, `migrate` and `runs` command a page shows, run.

The commands are read from the code fences of docs/*.md and README.md (continued lines joined,
`VAR=value` prefixes kept as the command's environment, `# comments` dropped). A command whose
files are the reader's own (`--config R`, `lora.yaml`: not in the repository) is left out; one
that names a repository file (recipes/...) must find it. All of them run in ONE process
(TRL and the recipe schema imported once), from the repository root, through the command's own
`main`; each must exit 0, unless the page shows its refusal: then the `error:` lines the page
shows after it must be what it prints (a `...` stands for any text). The blocks marked
`<!-- checked -->` are compared line by line as well (test_docs_checked.py).

The pages write the command as README.md does, `.venv/bin/maxent-grpo`.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.runs import child_env

PAGES = sorted([*(REPO / "docs").glob("*.md"), REPO / "README.md"])
CHEAP = ("check", "plan", "migrate", "runs")
COMMAND = re.compile(r"^(?:\$ )?((?:[A-Z_]+=\S+ )*)(\.venv/bin/)?maxent-grpo (\S+)(.*)$")
# What a page shows after a command as its output: the lines checked against what it prints.
SHOWN = ("error: ", "ok: ")
MARKER = "<!-- checked -->"


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    env: dict
    argv: tuple[str, ...]
    shown: tuple[str, ...]  # error:/ok: lines the page shows after it
    spelled: str  # how the page starts it: `.venv/bin/` or bare
    checked: bool  # in a `<!-- checked -->` block: test_docs_checked.py runs it

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _fences(path: Path):
    """(line number, [lines], checked) of each code fence of a page; checked: marked
    `<!-- checked -->` (test_docs_checked.py runs it)."""
    block, start, checked, previous = None, 0, False, ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            if block is None:
                block, start, checked = [], number, previous.strip() == MARKER
            else:
                yield start, block, checked
                block = None
        elif block is not None:
            block.append(line)
        previous = line


def commands(path: Path) -> list[Command]:
    found = []
    for start, block, checked in _fences(path):
        i = 0
        while i < len(block):
            text, line = block[i].strip(), start + i + 1
            while text.endswith("\\") and i + 1 < len(block):
                i += 1
                text = text[:-1] + " " + block[i].strip()
            i += 1
            match = COMMAND.match(text)
            if not match:
                continue
            prefix, venv, sub, rest = match.groups()
            shown = []
            for after in block[i:]:
                if COMMAND.match(after.strip()):
                    break
                if after.startswith(SHOWN):
                    shown.append(after.rstrip())
            env = dict(item.split("=", 1) for item in prefix.split())
            argv = (sub, *shlex.split(rest, comments=True))
            found.append(Command(path.name, line, env, argv, tuple(shown), venv or "", checked))
    return found


ALL = [c for page in PAGES for c in commands(page)]


def _paths(argv: tuple[str, ...]) -> list[str]:
    """The files a command reads: --config's value, migrate's source."""
    named = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"]
    if argv[0] == "migrate" and len(argv) > 1:
        named.append(argv[1])
    return named


def runnable(command: Command) -> bool:
    """A cheap command on the repository's own files (a reader's `R` or `lora.yaml` is not)."""
    if command.checked or command.argv[0] not in CHEAP:
        return False
    if command.argv[0] == "runs" and {"--dir", "--sweep"} & set(command.argv):
        return False  # the reader's folders, a sweep of theirs
    return all(p.startswith("recipes/") or (REPO / p).exists() for p in _paths(command.argv))


RUNNABLE = [c for c in ALL if runnable(c)]

# Run in one child: each command through cli.main, its output and exit code as JSON.
DRIVER = r"""
import contextlib, io, json, os, sys
from maxent_grpo import cli
results = []
for env, argv in json.load(sys.stdin):
    saved = dict(os.environ)
    os.environ.update(env)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    finally:
        os.environ.clear()
        os.environ.update(saved)
    results.append([code, out.getvalue()])
print(json.dumps(results))
"""


def _migrate_into(argv: tuple[str, ...], folder: Path) -> list[str]:
    """migrate's -o OUT written into `folder`: the docs' run leaves nothing in the checkout."""
    argv = list(argv)
    for flag in ("-o", "--out"):
        if flag in argv:
            at = argv.index(flag) + 1
            argv[at] = str(folder / Path(argv[at]).name)
    return argv


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple[int, str]]:
    folder = tmp_path_factory.mktemp("docs-commands")
    jobs = [(c.env, _migrate_into(c.argv, folder)) for c in RUNNABLE]
    done = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=json.dumps(jobs),
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    return {c.id: (code, output) for c, (code, output) in zip(RUNNABLE, answers)}


def test_the_pages_show_cheap_commands():
    assert len(RUNNABLE) >= 10, [c.id for c in RUNNABLE]
    assert {c.argv[0] for c in RUNNABLE} >= {"check", "plan", "runs"}


def test_every_recipe_a_command_names_is_there():
    """Any command (sbatch and sweep too): a recipes/ path the page names exists."""
    missing = [
        (c.id, p)
        for c in ALL
        for p in _paths(c.argv)
        if p.startswith("recipes/") and not (REPO / p).is_file()
    ]
    assert not missing, missing


def shown_in(shown: str, printed: list[str]) -> bool:
    """A line the page shows is a printed line; its `...` stand for any text."""
    pattern = ".*".join(re.escape(part) for part in shown.split("..."))
    return any(re.fullmatch(pattern, line) for line in printed)


@pytest.mark.parametrize("command", RUNNABLE, ids=lambda c: c.id)
def test_a_command_the_docs_show_runs_as_shown(results, command):
    code, output = results[command.id]
    printed = [line.rstrip() for line in output.splitlines()]
    errors = [s for s in command.shown if s.startswith("error: ")]
    assert code == (2 if errors else 0), f"{command.id}: {shlex.join(command.argv)}\n{output}"
    missing = [s for s in command.shown if not shown_in(s, printed)]
    assert not missing, f"{command.id}: the page shows lines it does not print: {missing}\n{output}"


def test_the_pages_write_the_command_as_the_readme_does():
    bare = [c.id for c in ALL if c.spelled != ".venv/bin/"]
    assert not bare, f"write .venv/bin/maxent-grpo (as README.md): {bare}"


def test_runs_and_plot_take_one_spelling_of_where_runs_are():
    """`--dir`, for runs and plot; plot's old `--outputs` is still read (one release)."""
    from maxent_grpo.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["runs", "--dir", "d"]).dirs == ["d"]
    assert parser.parse_args(["plot", "--dir", "d"]).outputs == "d"
    assert parser.parse_args(["plot", "--outputs", "d"]).outputs == "d"
    assert parser.parse_args(["plot"]).outputs == "outputs"


def _templates() -> list[re.Pattern]:
    """Every message the package can print, as a pattern: its literal text, and `.*` for each
    value an f-string puts in (implicit concatenation is one string in the AST)."""
    patterns = []
    for path in sorted((REPO / "src" / "maxent_grpo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr):
                parts = [
                    re.escape(v.value) if isinstance(v, ast.Constant) else ".*" for v in node.values
                ]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                parts = [re.escape(node.value)]
            else:
                continue
            literal = "".join(p for p in parts if p != ".*")
            if len(literal) >= 10:
                patterns.append(re.compile(".*" + "".join(parts) + ".*", re.DOTALL))
    for path in sorted((REPO / "scripts").glob("*.sh")):  # echo "error: ..." "..." (joined)
        text = re.sub(r'" \\\n\s*"', " ", path.read_text())
        for message in re.findall(r'echo "error: ([^"]+)"', text):
            parts = re.split(r"\$\{?\w+\}?", message)
            patterns.append(re.compile(".*".join(map(re.escape, parts))))
    return patterns


def shown_errors() -> list[tuple[str, str]]:
    """(page:line, message) of every whole `error:` line a page shows (an excerpt with `...`
    or a <placeholder> aside)."""
    found = []
    for page in PAGES:
        for start, block, _ in _fences(page):
            for offset, line in enumerate(block, 1):
                text = line.strip()
                if text.startswith("error: ") and "..." not in text and "<" not in text:
                    found.append((f"{page.name}:{start + offset}", text.removeprefix("error: ")))
    return found


def test_every_error_a_page_shows_is_the_tools_current_text():
    templates = _templates()
    shown = shown_errors()
    assert len(shown) >= 30, shown
    stale = [
        (where, text) for where, text in shown if not any(t.fullmatch(text) for t in templates)
    ]
    assert not stale, "error lines the tool no longer prints:\n" + "\n".join(map(str, stale))
