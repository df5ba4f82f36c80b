"""Child processes of a run: each in its own process group, logged to a file, always reaped.

Every child is started with start_new_session=True so that stopping it stops everything it
spawned (accelerate's workers, vLLM's engine processes) with one killpg.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path


def free_port() -> int:
    """A port the OS says is free now (two jobs on one node never pick the same fixed one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _ignore_stop_signals() -> None:
    """In the child, before exec: ignore SIGUSR1/SIGUSR2 (the disposition survives exec).

    Slurm's warning signals are for the launcher, which turns them into a checkpoint request;
    their default action would kill accelerate's launcher or vLLM outright.
    """
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class Child:
    """A process group with its output appended to a log file (and optionally echoed)."""

    def __init__(
        self,
        name: str,
        command: list[str] | tuple[str, ...],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        echo: bool = False,
    ):
        self.name = name
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Append: a requeued attempt adds to the log instead of truncating it.
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE if echo else self._log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            preexec_fn=_ignore_stop_signals,
        )
        self._pump = None
        if echo:
            self._pump = threading.Thread(target=self._copy_output, daemon=True)
            self._pump.start()

    def _copy_output(self) -> None:
        out = sys.stdout.buffer
        for line in iter(self.proc.stdout.readline, b""):
            self._log.write(line)
            self._log.flush()
            out.write(line)
            out.flush()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self) -> int:
        code = self.proc.wait()
        if self._pump is not None:
            self._pump.join(timeout=5)
        return code

    def signal(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the whole group, then SIGKILL what is left after `grace` seconds."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        # The leader may be gone while its children linger in the group: kill them all.
        self.signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        if self._pump is not None:
            self._pump.join(timeout=5)
        self._log.close()
        return self.proc.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            data = self.log_path.read_bytes()[-16384:]
        except OSError:
            return ""
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def wait_for_group_exit(pgid: int, timeout: float) -> bool:
    """True once no process of the group is left (for tests and teardown checks)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def slurm_nodes(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """The job's node names, in Slurm's order, when the job spans several nodes; else None.

    `scontrol show hostnames` expands a compressed list like "gpu[01-03,07]".
    """
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    count = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or "1"
    if not nodelist or not count.isdigit() or int(count) < 2:
        return None
    try:
        result = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"cannot expand SLURM_JOB_NODELIST={nodelist!r}: {exc}") from None
    return tuple(result.stdout.split()) or None
