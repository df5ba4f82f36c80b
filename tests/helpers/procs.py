"""The process table, for "nothing of the run is left" checks (zombies do not count).

PID 1 of a container may not reap orphans: a process that exited can linger as a zombie
(state Z) that holds nothing, so it is ignored.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _stat(pid: str) -> tuple[str, int] | None:
    """(state, process group) of a process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[2])


def _cmdline(pid: str) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        return raw.replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def live_processes(pgids: set[int] = frozenset(), marker: str | None = None) -> list[str]:
    """Live (non-zombie) processes in any of `pgids`, or whose command line holds `marker`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        stat = _stat(pid)
        if stat is None or stat[0] == "Z":
            continue
        cmdline = _cmdline(pid)
        if stat[1] in pgids or (marker and marker in cmdline):
            found.append(f"{pid} [{stat[0]}] {cmdline[:200]}")
    return found


def wait_until_gone(
    pgids: set[int] = frozenset(), marker: str | None = None, timeout: float = 15.0
) -> tuple[list[str], float]:
    """Poll until nothing matches; returns (what is still there, seconds waited)."""
    start = time.monotonic()
    while True:
        left = live_processes(pgids, marker)
        waited = time.monotonic() - start
        if not left or waited > timeout:
            return left, waited
        time.sleep(0.1)


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5, proc=None):
    """predicate's first true value, polled every `poll` s; an AssertionError naming `what`
    after `timeout` s, or as soon as `proc` (a Popen, optional) has exited."""
    deadline = time.monotonic() + timeout
    while True:
        if value := predicate():
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)


# Seconds allowed beyond what a time-bounded behaviour needs, for what takes well under a
# second idle (a process start or exit, a poll, a SIGTERM answered) but can be delayed by
# seconds on a loaded 2-core machine. A bound is "the behaviour's own time + LOADED_MARGIN".
LOADED_MARGIN = 15.0


def catches(pid: int, signum: int) -> bool:
    """Whether a process has a handler installed for `signum` (its SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) & (1 << (signum - 1)))
