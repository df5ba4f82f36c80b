"""A pytest plugin: tests leave the checkout as they found it (what a test writes goes under
tmp_path).

Each test: the run folders (`logs/`, `outputs/`, what `maxent-grpo runs` reads, and
`bench/results/`, `wandb/`) and the repository's top level are listed before and after; an
entry the test added fails it, naming the paths. The whole session is also compared with
`git status --porcelain --ignored --untracked-files=all`, caches left out, for files left
deeper in the tree. Both run with MAXENT_GRPO_CLEAN_CHECKOUT=1, which `make test` sets (the
other suites do not yet: their first run under it found a Slurm test's job writing
logs/slurm_N.err, since fixed); in a checkout that several people use at once, another's run
or new file would be blamed on the test that happened to be running.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers.paths import REPO
from maxent_grpo.recipe.checks import WRITE_PROBE_PREFIX

# Written by the runs a test starts (default logs_dir, output_dir, benchmark results, W&B).
RUN_FOLDERS = ("logs", "outputs", "bench/results", "wandb")
# Caches that tests may fill: interpreter, tools, the tiny model (made once, as training.sh
# does), the docs build.
CACHES = (
    ".venv/",
    ".cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".gpu-kit/",
    "docs/_build/",
    "docs/reference/generated/",
)


def _cache(path: str) -> bool:
    return path.startswith(CACHES) or "__pycache__/" in path or ".egg-info/" in path


def checkout() -> Path:
    """The tree watched: the repository, or the stand-in checkout that this plugin's own test
    names (a probe written into the real one would be blamed on another worker's test)."""
    return Path(os.environ.get("MAXENT_GRPO_CLEAN_CHECKOUT_ROOT") or REPO)


def listing() -> set[str]:
    """The top level and the run folders' entries, as paths relative to the repository.

    Left out: `check`'s writability probe of an output_dir whose nearest existing parent is
    the checkout, which another worker's test makes and removes within a moment (CI saw one
    in passing and blamed the test that was ending); the session's `git status` still names
    one left behind.
    """
    root = checkout()
    found = {p.name + "/" * p.is_dir() for p in root.iterdir()}
    for folder in RUN_FOLDERS:
        path = root / folder
        if path.is_dir():
            found |= {f"{folder}/{p.name}" for p in path.iterdir()}
    return {p for p in found if not _cache(p) and not p.startswith(WRITE_PROBE_PREFIX)}


def left_behind(before: set[str], after: set[str]) -> list[str]:
    return sorted(after - before)


def untracked() -> set[str]:
    """Untracked and ignored paths (`git status`), caches and bytecode left out."""
    result = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=all", "-z"],
        cwd=checkout(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    paths = {entry[3:] for entry in result.stdout.split("\0") if entry[:2] in ("??", "!!")}
    return {p for p in paths if not _cache(p)}


def active() -> bool:
    return os.environ.get("MAXENT_GRPO_CLEAN_CHECKOUT") == "1"


@pytest.fixture(autouse=True)
def _leaves_the_checkout_clean(request):
    if not active():
        yield
        return
    before = listing()
    yield
    new = left_behind(before, listing())
    if new:
        pytest.fail(
            f"{request.node.nodeid} left files in the checkout: {', '.join(new)}; write them "
            "under tmp_path (e.g. --logs-dir, output_dir)",
            pytrace=False,
        )


def _controller(config) -> bool:
    """The session check runs once, in the process that started the test workers (xdist)."""
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session):
    check = active() and _controller(session.config)
    session.config._clean_checkout_before = untracked() if check else None


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_clean_checkout_before", None)
    if before is None:
        return
    new = left_behind(before, untracked())
    if new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        line = f"tests left files in the checkout: {', '.join(new[:20])}"
        if reporter is not None:
            reporter.write_line(f"error: {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
