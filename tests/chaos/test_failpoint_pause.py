"""The failpoints' `pause` action, the chaos campaign's way to hit a moment: the process that
reaches the point names itself in the hits file and stops there, once, until continued."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from helpers.procs import wait_for
from helpers.runs import child_env

PROGRAM = """
from maxent_grpo.faults import failpoint
for step in (1, 2, 3):
    failpoint("scoring", 2)      # the step-2 point only, and only once
    failpoint("teardown")        # a point without a step: once too
    print("passed", step, flush=True)
"""


@pytest.fixture
def started():
    """Popen's of the test, killed at its end whatever happened (a stopped one stays stopped)."""
    procs = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def state(pid: int) -> str:
    text = open(f"/proc/{pid}/stat").read()
    return text[text.rindex(")") + 2]


def test_pause_stops_once_at_the_point_and_names_the_process(tmp_path, started):
    hits = tmp_path / "hits"
    env = child_env(MAXENT_GRPO_FAILPOINT="scoring:2:pause", MAXENT_GRPO_FAILPOINT_HITS=str(hits))
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], env=env, stdout=subprocess.PIPE)
    started.append(proc)
    wait_for(lambda: hits.is_file() and state(proc.pid) == "T", 60, "the pause", 0.05, proc)
    assert hits.read_text() == f"{proc.pid} scoring 2\n"
    proc.send_signal(signal.SIGCONT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.decode().split("\n")[:3] == [
        "passed 1",
        "passed 2",
        "passed 3",
    ]
    assert hits.read_text().count("\n") == 1  # paused once, not at every call


def test_a_point_without_a_step_pauses_once(tmp_path, started):
    hits = tmp_path / "hits"
    env = child_env(MAXENT_GRPO_FAILPOINT="teardown::pause", MAXENT_GRPO_FAILPOINT_HITS=str(hits))
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], env=env, stdout=subprocess.PIPE)
    started.append(proc)
    wait_for(lambda: hits.is_file() and state(proc.pid) == "T", 60, "the pause", 0.05, proc)
    proc.send_signal(signal.SIGCONT)
    proc.communicate(timeout=60)
    assert proc.returncode == 0 and hits.read_text() == f"{proc.pid} teardown None\n"
