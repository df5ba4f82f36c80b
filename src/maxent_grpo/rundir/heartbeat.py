"""Heartbeats: every training process says it is alive and where it is; the launcher watches.

This module is the files (written by the trainers, train/heartbeat.py attaches them to a
trainer; read by the launcher): no trainer code, no torch.

Each rank rewrites `<output_dir>/.heartbeat/rank-<R>.json` at each phase change: trainer
built, training begins, generation begins and ends, a step ends, a save begins and ends, an
evaluation batch ends. The launcher (launch/watchdog.py) counts a rank as progressing while
its file keeps changing and measures the silence with its own clock (no clock skew between
nodes). Nothing here runs on a thread: a hung main thread stops the beats, which is the point.
A beat rewrites the file in place, padded to a fixed width: 5 µs, where a truncating write or
a rename costs 0.25-0.5 ms on ext4 (its replace-via-truncate/rename flush), three times a
step. close() still publishes it to other NFS clients; a reader that catches a write half
done gets invalid JSON and reads again at its next poll.

Also here, for the launcher's diagnosis of a hang or a crash:
- DUMP_SIGNAL: faulthandler writes every thread's Python stack to `rank-<R>.stacks` when the
  launcher sends it (the launcher copies the files into the train log, one rank after the
  other: ranks dumping into one shared stderr interleave); the process then stops itself
  (SIGSTOP): the launcher sends it only to a run it kills as hung.
- the exit report `rank-<R>.exit.json`: the exception that ended this process (its class
  decides oom vs crash, launch/outcomes.py), written by sys.excepthook before it dies.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

from maxent_grpo.errors import UserError
from maxent_grpo.timers import timed

HEARTBEAT_DIR = ".heartbeat"
# Real-time signal: nothing else uses it (Slurm's warnings are SIGUSR1/SIGUSR2, torchrun's
# agent handles SIGTERM, SIGINT, SIGHUP, SIGQUIT). Its default action kills: send it only to
# processes that reported their pid in a heartbeat (they registered the handler first).
DUMP_SIGNAL = signal.SIGRTMIN + 4
# Phases that repeat quickly (one per evaluation batch) are written at most this often.
_MIN_REPEAT_S = 1.0
# A beat's JSON is about 250 bytes; padded to this so a shorter beat overwrites a longer one.
_BEAT_WIDTH = 512


def heartbeat_dir(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / HEARTBEAT_DIR


def _write(path: Path, payload: dict) -> None:
    """Readers see the old or the new content, never half of one (no fsync)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


class Heartbeat:
    """This rank's heartbeat file and exit report."""

    def __init__(self, output_dir: str | os.PathLike, rank: int | None = None):
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        self.dir = heartbeat_dir(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / f"rank-{self.rank}.json"
        self.width = _BEAT_WIDTH
        self.count = 0
        self.phase = ""
        self.written = 0.0
        self.step_began = time.monotonic()
        self.last_step_s: float | None = None
        self.slowest_step_s = 0.0

    def beat(self, phase: str, step: int | None = None) -> None:
        with timed("heartbeat"):
            self._beat(phase, step)

    def _beat(self, phase: str, step: int | None) -> None:
        now = time.monotonic()
        if phase == self.phase and phase == "evaluate" and now - self.written < _MIN_REPEAT_S:
            return
        self.count += 1
        self.phase, self.written = phase, now
        payload = {
            "rank": self.rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "phase": phase,
            "step": step,
            "count": self.count,
            "time": round(time.time(), 3),
            "step_s": self.last_step_s,
            "slowest_step_s": self.slowest_step_s,
        }
        text = json.dumps(payload)
        self.width = max(self.width, len(text))  # never shorter: no stale tail after the JSON
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, text.ljust(self.width).encode(), 0)
            finally:
                os.close(fd)
        except OSError:
            pass  # a full or vanished disk must not stop training; the launcher will notice

    def step_done(self, step: int) -> None:
        now = time.monotonic()
        self.last_step_s = round(now - self.step_began, 3)
        self.slowest_step_s = max(self.slowest_step_s, self.last_step_s)
        self.step_began = now
        self.beat("step_end", step)

    def report_exit(self, exc: BaseException) -> None:
        """Write why this process ends: the launcher classifies the attempt from it."""
        payload = {
            "rank": self.rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "kind": exit_kind(exc),
            "type": type(exc).__name__,
            "message": " ".join(str(exc).split())[:500],
            "time": round(time.time(), 3),
        }
        try:
            _write(self.dir / f"rank-{self.rank}.exit.json", payload)
        except OSError:
            pass


def exit_kind(exc: BaseException) -> str:
    """oom | user_error | error, from an exception's class (and its causes)."""
    seen = exc
    while seen is not None:
        if isinstance(seen, UserError):
            return "user_error"
        if _is_oom(seen):
            return "oom"
        seen = seen.__cause__ or seen.__context__
    return "error"


def _is_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom is not None and isinstance(exc, oom):
        return True
    return isinstance(exc, MemoryError)


def stacks_path(output_dir: str | os.PathLike, rank: int) -> Path:
    """Where rank `rank` writes its stacks on DUMP_SIGNAL."""
    return heartbeat_dir(output_dir) / f"rank-{rank}.stacks"


def clear_heartbeats(output_dir: str | os.PathLike) -> None:
    """Forget the previous attempt's heartbeats and exit reports (the launcher, at start)."""
    shutil.rmtree(heartbeat_dir(output_dir), ignore_errors=True)


def _read_all(output_dir: str | os.PathLike, suffix: str) -> list[dict]:
    """Every rank-N<suffix> file of this attempt, read as JSON (unreadable ones skipped)."""
    found = []
    for path in sorted(heartbeat_dir(output_dir).glob(f"rank-*{suffix}")):
        if not path.name.removeprefix("rank-").removesuffix(suffix).isdigit():
            continue
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return found


def read_exit_reports(output_dir: str | os.PathLike) -> list[dict]:
    """The exit reports of this attempt's training processes (Heartbeat.report_exit)."""
    return _read_all(output_dir, ".exit.json")


def read_heartbeats(output_dir: str | os.PathLike) -> list[dict]:
    """The last heartbeat of each of this attempt's training processes (rank, host, phase)."""
    return _read_all(output_dir, ".json")
