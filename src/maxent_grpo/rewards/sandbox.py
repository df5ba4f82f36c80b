"""Run a model's Python program locally, so that a hostile or broken one cannot hurt the trainer.

Each run gets, in layers (a layer the machine does not allow is skipped, the others remain):

- a fresh temporary directory as working directory, HOME and TMPDIR, removed afterwards;
- ``python -I -B`` (isolated mode: no PYTHON* variables, no user site, no script directory on
  ``sys.path``) with a scrubbed environment (PATH, LANG, HOME, TMPDIR only);
- resource limits set in the child before exec (``resource.setrlimit``): CPU seconds
  (RLIMIT_CPU), address space (RLIMIT_AS), size of any file written, stdout included
  (RLIMIT_FSIZE), no core files; RLIMIT_NPROC 0 (no new process or thread; the kernel does not
  enforce it for root, where the audit hook and the PID namespace below do the job);
- its own session and process group, killed as a whole (SIGKILL) at the wall-clock limit and
  after every run, so nothing it started survives it;
- where ``unshare`` works (root, or unprivileged user namespaces): a new network namespace (no
  interface but a down loopback: no connection can be made) and a new PID namespace (the
  program sees no other process, and everything in it dies with it);
- an audit hook (PEP 578), installed before the program runs, that refuses process creation,
  signals to other processes, network connections, ctypes, raising resource limits, and any
  write, rename, removal or link outside the working directory.

The audit hook works inside Python only: it stops accidents and ordinary hostile code, not a
determined attacker with a C-level escape; run untrusted code at scale in a container.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("maxent_grpo.rewards")

#: Environment of the sandboxed program (nothing of the trainer's, no tokens).
_ENV_KEEP = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

# The namespace wrappers tried in order; the first that runs `true` is used.
_NAMESPACE_WRAPPERS = (
    ["unshare", "--net", "--pid", "--fork", "--kill-child", "--"],
    ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--"],
)

# Installed by `python -c` before the program runs: argv[1] is the sandbox directory, argv[2]
# the program file. Every name the hook uses is bound at install time, so that the program
# cannot rebind it. Kept in one string: it runs in the child, not in this process.
_BOOTSTRAP = r"""
import os, resource, sys

def _install(root, realpath=os.path.realpath, isdir=os.path.isdir, fspath=os.fspath,
             write_flags=os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC):
    root = realpath(root)
    denied = frozenset((
        "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
        "os.kill", "os.killpg", "signal.pthread_kill", "subprocess.Popen",
        "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function",
        "resource.setrlimit", "resource.prlimit", "os.chroot", "os.setxattr",
        "os.removexattr", "os.chflags", "os.lchflags", "os.mknod", "os.mkfifo",
    ))
    path_events = {"os.remove": (0,), "os.rename": (0, 1), "os.rmdir": (0,), "os.mkdir": (0,),
                   "os.symlink": (1,), "os.link": (0, 1), "os.truncate": (0,),
                   "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,)}
    blocked_imports = frozenset(("_posixsubprocess", "_ctypes", "ctypes"))

    def inside(path):
        if isinstance(path, int):
            return True  # an already open descriptor: only 0, 1 and 2 are inherited
        full = realpath(fspath(path))
        return full == root or full.startswith(root + "/") or full == "/dev/null"

    def hook(event, args):
        if event in denied:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0] in blocked_imports:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
        if event == "open":
            path, flags = args[0], args[2]
            writes = bool(flags & write_flags)
            if not inside(path) and (writes or (not isinstance(path, int) and isdir(path))):
                raise PermissionError(f"sandbox: writing {path!r} is not allowed")
        elif event in path_events:
            for i in path_events[event]:
                if not inside(args[i]):
                    raise PermissionError(f"sandbox: {event} on {args[i]!r} is not allowed")

    sys.addaudithook(hook)

for _name in ("_posixsubprocess", "subprocess", "ctypes", "_ctypes"):
    sys.modules.pop(_name, None)
resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
_root, _file = sys.argv[1], sys.argv[2]
with open(_file, encoding="utf-8") as _handle:
    _code = compile(_handle.read(), "solution.py", "exec")
sys.argv = ["solution.py"]
_install(_root)
del _install, _root, _file, _handle, _name
exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
"""


@dataclass(frozen=True)
class Limits:
    """What one run may use. CPU time defaults to the wall time (rounded up) plus one second."""

    wall_seconds: float = 5.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    cpu_seconds: int | None = None
    output_chars: int = 1 << 20  # of stdout kept for comparison

    @property
    def cpu_limit(self) -> int:
        return self.cpu_seconds or math.ceil(self.wall_seconds) + 1


@dataclass(frozen=True)
class RunResult:
    """How a run ended: `status` is "ok" (exit 0), "error" (other exit or signal) or "timeout"."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _limit_child(limits: Limits) -> None:
    """preexec_fn: runs in the child between fork and exec (no locks, no logging here)."""
    cpu = limits.cpu_limit
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL
    memory = limits.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = limits.file_size_mb << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@functools.cache
def namespace_wrapper() -> tuple[str, ...]:
    """The `unshare` prefix this machine allows (network + PID namespaces), or () if none."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return ()
    for wrapper in _NAMESPACE_WRAPPERS:
        try:
            probe = subprocess.run([*wrapper, "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return tuple(wrapper)
    logger.warning(
        "code sandbox: unshare is not allowed here, so programs run without network and PID "
        "namespaces; the audit hook still refuses network connections"
    )
    return ()


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _read(path: Path, limit: int) -> str:
    with open(path, "rb") as handle:
        return handle.read(limit).decode("utf-8", errors="replace")


def run_command(argv: list[str], stdin: str, limits: Limits, workdir: Path) -> RunResult:
    """Run argv in workdir under the limits, its own process group and a scrubbed environment.

    stdin comes from a file and stdout/stderr go to files (RLIMIT_FSIZE bounds them), so no
    pipe can fill up and no output can exhaust the trainer's memory.
    """
    (workdir / "stdin.txt").write_text(stdin)
    env = {**_ENV_KEEP, "HOME": str(workdir), "TMPDIR": str(workdir)}
    start = time.monotonic()
    with (
        open(workdir / "stdin.txt", "rb") as fin,
        open(workdir / "stdout.txt", "wb") as fout,
        open(workdir / "stderr.txt", "wb") as ferr,
    ):
        process = subprocess.Popen(
            argv,
            stdin=fin,
            stdout=fout,
            stderr=ferr,
            cwd=workdir,
            env=env,
            close_fds=True,
            start_new_session=True,  # its own process group, killed as one below
            preexec_fn=functools.partial(_limit_child, limits),  # noqa: PLW1509 - no threads here
        )
        try:
            returncode = process.wait(timeout=limits.wall_seconds)
            status = "ok" if returncode == 0 else "error"
        except subprocess.TimeoutExpired:
            returncode, status = None, "timeout"
        finally:
            _kill_group(process)  # whatever it started dies with it
            process.wait()
    return RunResult(
        status=status,
        returncode=returncode,
        stdout=_read(workdir / "stdout.txt", limits.output_chars),
        stderr=_read(workdir / "stderr.txt", 4000),
        seconds=time.monotonic() - start,
    )


def run_python(source: str, stdin: str = "", limits: Limits | None = None) -> RunResult:
    """Run a Python program with the given stdin in a fresh sandbox directory."""
    limits = limits or Limits()
    with tempfile.TemporaryDirectory(prefix="maxent-sandbox-") as tmp:
        workdir = Path(tmp)
        (workdir / "solution.py").write_text(source)
        argv = [
            *namespace_wrapper(),
            sys.executable,
            "-I",
            "-B",
            "-c",
            _BOOTSTRAP,
            str(workdir),
            str(workdir / "solution.py"),
        ]
        return run_command(argv, stdin, limits, workdir)
