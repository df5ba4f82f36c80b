"""Stack dumps on a hang: every rank's and every server's Python stacks into the train log.

py-spy when installed (works on any Python process); else the processes' own faulthandler:
DUMP_SIGNAL for the ranks (registered by train/heartbeat.py: a rank stops itself once its
dump is written), SIGABRT for a vLLM server (PYTHONFAULTHANDLER=1 in its environment). Then
every process of the run is killed (stop_hung); the last complete checkpoint stays. What is
a hang is launch/hang.py's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from maxent_grpo.launch.hang import Hang
from maxent_grpo.launch.processes import process_state
from maxent_grpo.rundir.heartbeat import DUMP_SIGNAL, stacks_path

# Longest wait for the dumps to be written (usually well under a second; a loaded machine may
# take seconds to schedule a process that was just continued).
DUMP_WAIT_S = 10.0


def _py_spy(pid: int) -> str | None:
    """`py-spy dump` of a process (None without py-spy): works on any Python process."""
    exe = shutil.which("py-spy")
    if exe is None:
        return None
    try:
        result = subprocess.run(
            [exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"py-spy dump --pid {pid} failed: {exc}"
    return result.stdout + result.stderr


def dump_rank_stacks(beats: dict[int, dict], directory: Path, note: Callable[[str], None]) -> None:
    """Every local rank's Python stacks into the train log: py-spy when installed, else
    DUMP_SIGNAL (faulthandler, registered by train/heartbeat.py, writes rank-<R>.stacks; the
    files are copied into the log one rank after the other). A stopped rank (SIGSTOP) is
    continued so that it can write; a rank stops itself once its dump is written
    (train/heartbeat.py install_stack_dump), and is stopped again here once the dumps are
    whole (a rank that installed its dump off the main thread cannot stop itself), so that
    no rank trains on, saves or finishes the run before the kill that follows."""
    here = os.uname().nodename
    pending = {}
    for rank, beat in sorted(beats.items()):
        pid = int(beat.get("pid") or 0)
        if beat.get("host") != here:
            note(f"rank {rank} runs on {beat.get('host')}: its stacks cannot be dumped from here")
            continue
        state = process_state(pid)
        if state is None or state == "Z":
            note(f"rank {rank} (pid {pid}) is gone: no stacks")
            continue
        spied = _py_spy(pid)
        if spied is not None:
            note(f"stacks of rank {rank} (pid {pid}, py-spy):\n{spied}")
            continue
        path = stacks_path(directory.parent, rank)
        pending[rank] = (pid, path, path.stat().st_size if path.is_file() else 0)
        os.kill(pid, DUMP_SIGNAL)
        if state == "T":
            os.kill(pid, signal.SIGCONT)
    _wait_for_growth([(path, size) for _pid, path, size in pending.values()])
    for pid, _path, _size in pending.values():
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    for rank, (pid, path, size) in sorted(pending.items()):
        text = _read_from(path, size)
        note(f"stacks of rank {rank} (pid {pid}, faulthandler):\n{text or '(none written)'}")


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _wait_for_growth(
    files: list[tuple[Path, int]], timeout: float = DUMP_WAIT_S, quiet: float = 1.0
) -> None:
    """Until every file grew past its size, ends a line and has not grown for `quiet` s, at
    most timeout. faulthandler writes a dump in many small writes: on a busy machine a rank
    just continued from SIGSTOP paused mid-line for longer than 0.2 s, and its dump was cut."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        sizes = [path.stat().st_size if path.is_file() else 0 for path, _ in files]
        if sizes != last:
            last, since = sizes, time.monotonic()
        grown = all(now > before for now, (_, before) in zip(sizes, files))
        if grown and time.monotonic() - since >= quiet and all(map(_ends_a_line, files)):
            return
        time.sleep(0.1)


def _ends_a_line(file: tuple[Path, int]) -> bool:
    try:
        with open(file[0], "rb") as handle:
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) == b"\n"
    except OSError:
        return False


def dump_server_stacks(pids: list[int], log: Path, note: Callable[[str], None]) -> None:
    """The vLLM server's stacks: py-spy when installed, else SIGABRT, which Python's
    faulthandler (PYTHONFAULTHANDLER=1 in the server's environment) turns into a dump of
    every thread on the server's stderr; no core file (RLIMIT_CORE 0 first). Then the new end
    of the server log is copied into the train log."""
    size = log.stat().st_size if log.is_file() else 0
    for pid in pids:
        spied = _py_spy(pid)
        if spied is not None:
            note(f"stacks of vLLM server process {pid} (py-spy):\n{spied}")
            continue
        try:
            import resource  # Unix only: ImportError elsewhere

            resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
        except (OSError, ValueError, ImportError):
            pass
        for signum in (signal.SIGABRT, signal.SIGCONT):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                break
    if shutil.which("py-spy") is None and pids:
        _wait_for_growth([(log, size)])
        text = _read_from(log, size)
        note(f"stacks of the vLLM server (from {log}):\n{text or '(none written)'}")


class LogNote:
    """Append a line to the train log, the run's log (the trainer's Child echoes that log on
    the launcher's output)."""

    def __init__(self, log: Path):
        self.log = Path(log)

    def __call__(self, text: str) -> None:
        try:
            with open(self.log, "a") as handle:
                handle.write(text.rstrip("\n") + "\n")
        except OSError:
            print(text, flush=True)


def stop_hung(hang: Hang, trainer, servers: Sequence, log: Path, directory: Path) -> None:
    """Say what hangs, dump every reachable stack into the train log, kill every process.

    trainer: a processes.Child (or None); servers: launch/watch.py Servers; directory: the
    heartbeat directory.
    """
    note = LogNote(log)
    note(f"hang: {hang.reason}")
    for line in hang.details:
        note(f"  {line}")
    dump_rank_stacks(hang.beats, directory, note)
    for server in servers:
        server.dump_stacks(note)
    note("stopping every process of the run; the last complete checkpoint stays")
    if trainer is not None:
        trainer.signal(signal.SIGKILL)
    for server in servers:
        server.kill()
