"""A hung rank's stack dump (launch/stacks.py dump_rank_stacks, train/heartbeat.py
install_stack_dump) with a real process: its dump is written and whole, and then it stands
still until the kill that follows.

A rank stopped with SIGSTOP is continued so that faulthandler can write; it trained on
meanwhile and could finish the run before the kill (seeds 2653940617, 2550607500,
3698213687: `completed` after a hang). The child here counts in a loop, writing its count to a
file, as a training loop would write checkpoints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.procs import wait_for
from maxent_grpo.launch import stacks
from maxent_grpo.launch.processes import process_state
from maxent_grpo.rundir.heartbeat import stacks_path

CHILD = """
import sys, threading, time
from maxent_grpo.train.heartbeat import install_stack_dump

stacks = open(sys.argv[1], "a")
if sys.argv[3] == "thread":  # installed off the main thread: no handler of Python's there
    installer = threading.Thread(target=install_stack_dump, args=(stacks,))
    installer.start()
    installer.join()
else:
    install_stack_dump(stacks)

def counting_loop(path):
    count = 0
    while True:
        count += 1
        with open(path, "w") as handle:
            handle.write(str(count))
        time.sleep(0.005)

counting_loop(sys.argv[2])
"""


def read_count(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


@pytest.fixture
def child(tmp_path, request):
    """(pid, counter file, heartbeat dir) of a counting child, with its dump installed the
    way `request.param` says (main: in the main thread, as a trainer does; thread)."""
    beats = tmp_path / "out" / ".heartbeat"
    beats.mkdir(parents=True)
    counter = tmp_path / "count"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(stacks_path(tmp_path / "out", 0)), str(counter)]
        + [request.param]
    )
    try:
        wait_for(lambda: read_count(counter) > 20, 60, "the child counting", 0.05, proc)
        yield proc.pid, counter, beats
    finally:
        proc.kill()
        proc.wait(30)


def stop_and_dump(pid: int, counter: Path, beats: Path, monkeypatch) -> tuple[str, int]:
    """SIGSTOP the child (a stopped rank), then dump_rank_stacks as stop_hung calls it
    (faulthandler's path: no py-spy); returns (what it noted, the count at the stop)."""
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: process_state(pid) == "T", 10, "the child stopped", 0.01)
    at_stop = read_count(counter)
    monkeypatch.setattr(stacks, "_py_spy", lambda _pid: None)
    notes: list[str] = []
    beat = {"pid": pid, "host": os.uname().nodename}
    stacks.dump_rank_stacks({0: beat}, beats, notes.append)
    return "\n".join(notes), at_stop


def assert_dumped(noted: str) -> None:
    assert "stacks of rank 0 (pid " in noted and ", faulthandler):" in noted, noted
    assert "(most recent call first)" in noted and "in counting_loop" in noted, noted
    assert noted.rstrip().endswith("in <module>"), noted  # whole: to the outermost frame


@pytest.mark.parametrize("child", ["main"], indirect=True)
def test_a_stopped_rank_stands_still_once_its_dump_is_written(child, monkeypatch):
    """The rank stops itself at once after its dump: it does not count on (train on) while the
    launcher waits for the dump to be whole, nor after."""
    pid, counter, beats = child
    noted, at_stop = stop_and_dump(pid, counter, beats, monkeypatch)
    assert_dumped(noted)
    assert process_state(pid) == "T"
    # At most the iteration that was under way when it was stopped.
    assert read_count(counter) <= at_stop + 1, (at_stop, read_count(counter))
    time.sleep(1.0)
    assert process_state(pid) == "T" and read_count(counter) <= at_stop + 1


@pytest.mark.parametrize("child", ["thread"], indirect=True)
def test_a_rank_that_cannot_stop_itself_is_stopped_by_the_launcher(child, monkeypatch):
    """Installed off the main thread (no Python handler possible there): the dump alone; the
    launcher stops the rank again once its dump is whole."""
    pid, counter, beats = child
    noted, _at_stop = stop_and_dump(pid, counter, beats, monkeypatch)
    assert_dumped(noted)
    wait_for(lambda: process_state(pid) == "T", 10, "the child stopped again", 0.01)
    after = read_count(counter)
    time.sleep(1.0)
    assert read_count(counter) == after and process_state(pid) == "T"
