"""tests/helpers/ci_skips.py: with CI set, a skip fails, unless another CI step runs the test."""

from __future__ import annotations

import subprocess

from helpers.paths import PYTHON, REPO

TESTS = """
import pytest

def test_skipped():
    pytest.skip("needs something")

@pytest.mark.gpukit
def test_for_its_own_step():
    pytest.skip("its own step runs it")
"""


def pytest_run(folder, ci: str | None, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "tests")}
    if ci is not None:
        env["CI"] = ci
    command = [
        PYTHON,
        "-m",
        "pytest",
        "-q",
        "-rA",
        "-p",
        "helpers.ci_skips",
        "-p",
        "no:cacheprovider",
    ]
    command += ["-o", "markers=gpukit", *args]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def test_a_skip_fails_only_in_ci(tmp_path):
    (tmp_path / "test_x.py").write_text(TESTS)
    local = pytest_run(tmp_path, None, "test_x.py")
    assert local.returncode == 0 and "2 skipped" in local.stdout, local.stdout
    ci = pytest_run(tmp_path, "true", "test_x.py")
    assert ci.returncode == 1, ci.stdout
    assert "1 failed, 1 skipped" in ci.stdout, ci.stdout
    assert "(a skip fails in CI): Skipped: needs something" in ci.stdout
    # In the gpukit step itself, its test's skip fails too.
    own = pytest_run(tmp_path, "true", "-m", "gpukit", "test_x.py")
    assert "1 failed" in own.stdout and "1 deselected" in own.stdout, own.stdout


def test_a_module_skipped_whole_fails_in_ci(tmp_path):
    (tmp_path / "test_y.py").write_text('import pytest\npytest.importorskip("no_such_module")\n')
    assert pytest_run(tmp_path, "false", "test_y.py").returncode == 5  # all skipped: no tests
    ci = pytest_run(tmp_path, "true", "test_y.py")
    assert ci.returncode != 0 and "no_such_module" in ci.stdout, ci.stdout
    assert "(a skip fails in CI)" in ci.stdout, ci.stdout
