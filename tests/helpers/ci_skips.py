"""A pytest plugin: with CI set (.ci/run's runner sets CI=true), a skip is a failure.

What a test needs is installed or arranged by .ci/run, so a skip there would hide a test that
never ran. The one exception: a test that a CI step of its own runs (a marker of OWN_CI_STEP)
may skip in the other steps, e.g. the GPU kit's test in `make test`.
"""

from __future__ import annotations

import os

import pytest

# Markers whose tests a step of their own runs in CI (.ci/run: make test-slurm, test-multinode,
# test-vllm, test-fresh-clone, test-gpu-kit, test-redteam).
OWN_CI_STEP = {"slurm", "multinode", "vllm", "freshclone", "gpukit", "redteam", "chaos"}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def skip_allowed_in_ci(item: pytest.Item) -> bool:
    """Only for a test with a marker of OWN_CI_STEP whose step this run (its -m) is not."""
    selected = item.config.getoption("markexpr", "")
    return any(m.name in OWN_CI_STEP and m.name != selected for m in item.iter_markers())


def _fail(report, reason) -> None:
    if isinstance(reason, tuple):  # (file, line, message)
        reason = reason[2]
    report.outcome = "failed"
    report.longrepr = f"skipped with CI={os.environ['CI']} (a skip fails in CI): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        if not skip_allowed_in_ci(item):
            _fail(report, report.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A whole module skipped (pytest.importorskip at its top) fails too."""
    report = (yield).get_result()
    if in_ci() and report.skipped:
        _fail(report, report.longrepr)
