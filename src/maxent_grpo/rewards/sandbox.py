"""Run a model's Python program so that it can neither hurt the trainer nor see its data.

Isolation is the operating system's (``isolation: "bwrap"``, the default): each run is one
bubblewrap (``bwrap``) sandbox with

- its own user, mount, PID, network, IPC, UTS and cgroup namespaces; inside, the program is uid
  and gid 65534 with no capability, ``no_new_privs`` set and nested user namespaces disabled;
  outside, it is the trainer's uid, and never root: a root trainer starts bwrap itself as uid
  and gid 65534 with no supplementary group (a user namespace maps to its creator's uid), in a
  private mount namespace where the Python installation is reachable for that uid
  (``_root_view``: a Python under ``/root``, mode 700, is not);
- a new root holding only the Python installation and the system libraries, read-only, its own
  ``/proc`` (only its own processes) and a minimal ``/dev``; the working directory ``/box`` is a
  tmpfs capped at ``Limits.disk_mb``: nothing of the trainer's files, environment or processes;
- a seccomp filter (x86-64) refusing new processes and threads, ptrace, mount, namespace and
  keyring calls, BPF, perf and io_uring;
- rlimits set before exec (CPU, address space, file size, no core files), ``--die-with-parent``
  and its own session, killed as a whole at the wall-clock limit;
- no descriptor of the trainer but stdin (a memory file), stdout and stderr (pipes that this
  process reads itself, bounded and with a deadline) and, for the unit-test runner, its two
  channels.

Where bwrap is missing or user namespaces are refused, :func:`require` refuses the code rewards
in one line unless the recipe opts into ``code_sandbox: weak``
(:mod:`maxent_grpo.rewards.weak_sandbox`: an audit hook inside the interpreter, which a
determined program escapes).
"""

from __future__ import annotations

import ctypes
import functools
import json
import logging
import math
import os
import platform
import resource
import selectors
import shutil
import signal
import site
import stat
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.rewards.common import RewardError
from maxent_grpo.rewards.weak_sandbox import weak_argv

logger = logging.getLogger("maxent_grpo.rewards")

#: Environment of the sandboxed program (nothing of the trainer's, no tokens).
_ENV_KEEP = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
ISOLATIONS = ("bwrap", "weak")
_BOX = "/box"  # the program's working directory inside the bwrap sandbox
_SANDBOX_ID = "65534"  # uid and gid of the program inside its user namespace ("nobody")
_NOBODY = 65534  # and outside it, when the trainer is root
_CLONE_NEWNS = 0x00020000

# x86-64 system calls the program gets EPERM for: processes and threads (clone, clone3, fork,
# vfork), other processes' memory, mounts and namespaces, keyrings, kernel modules, BPF,
# perf, userfaultfd, io_uring, personality. Numbers from the kernel's syscall_64.tbl.
_DENIED_X86_64 = (56, 57, 58, 435, 101, 310, 311, 165, 166, 155, 161, 272, 308, 248, 249, 250)
_DENIED_X86_64 += (175, 176, 313, 246, 320, 321, 298, 323, 425, 426, 427, 135, 303, 304)


@dataclass(frozen=True)
class Limits:
    """What one run may use. CPU time defaults to the wall time (rounded up) plus one second."""

    wall_seconds: float = 5.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    cpu_seconds: int | None = None
    output_chars: int = 1 << 20  # of stdout kept; more ends the run as an error
    disk_mb: int = 64  # size of the tmpfs working directory (bwrap)
    isolation: str = "bwrap"  # or "weak": the recipe's code_sandbox

    @property
    def cpu_limit(self) -> int:
        return self.cpu_seconds or math.ceil(self.wall_seconds) + 1


@dataclass(frozen=True)
class RunResult:
    """How a run ended: `status` is "ok" (exit 0), "error" (other exit, signal, too much
    output) or "timeout"; `channel` holds what the unit-test runner reported (bytes)."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    channel: bytes = b""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _seccomp_filter() -> bytes:
    """A classic-BPF seccomp program (struct sock_filter array), or b"" off x86-64."""
    if platform.machine() != "x86_64":
        return b""
    ins = [(0x20, 0, 0, 4), (0x15, 1, 0, 0xC000003E), (0x06, 0, 0, 0x80000000)]  # arch or kill
    ins += [(0x20, 0, 0, 0), (0x35, 0, 1, 0x40000000), (0x06, 0, 0, 0x00050001)]  # x32: EPERM
    for number in _DENIED_X86_64:
        ins += [(0x15, 0, 1, number), (0x06, 0, 0, 0x00050001)]  # SECCOMP_RET_ERRNO | EPERM
    ins.append((0x06, 0, 0, 0x7FFF0000))  # SECCOMP_RET_ALLOW
    return b"".join(struct.pack("<HBBI", *i) for i in ins)


def _memfd(name: str, data: bytes) -> int:
    """A memory file holding data, positioned at its start (no disk, never blocks)."""
    fd = os.memfd_create(name, 0)
    os.write(fd, data)  # a memory file takes all of it at once
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _readonly_sources() -> list[str]:
    """The host directories bound read-only into the sandbox."""
    paths = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", sys.base_prefix)
    return [path for path in paths if not os.path.islink(path) and os.path.isdir(path)]


def _readonly_binds() -> list[str]:
    """bwrap arguments exposing the interpreter and the system libraries, read-only.

    The installation's site-packages are masked by an empty read-only tmpfs: the program gets
    the standard library only, and the interpreter starts without reading their .pth files
    (38 ms down to 12 ms per run here).
    """
    args = []
    for path in ("/usr/lib", "/usr/lib64", "/lib", "/lib64"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
    for path in _readonly_sources():
        args += ["--ro-bind", path, path]
    for path in site.getsitepackages([sys.base_prefix]):
        if os.path.isdir(path):
            args += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
    return args


def _searchable_by_nobody(path: str) -> bool:
    info = os.stat(path)
    if info.st_uid == _NOBODY:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == _NOBODY:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def _hidden_ancestors(sources: list[str]) -> list[str]:
    """The topmost directories above the sources that uid 65534 cannot search (/root, 700)."""
    hidden: list[str] = []
    for source in sources:
        parts = Path(source).parts
        for depth in range(2, len(parts)):
            ancestor = os.path.join(*parts[:depth])
            if any(ancestor == h or ancestor.startswith(h + "/") for h in hidden):
                break
            if not _searchable_by_nobody(ancestor):
                hidden.append(ancestor)
                break
    return hidden


# Run as root in a helper process: a private mount namespace where each hidden ancestor is
# covered by an empty tmpfs (mode 755) and the sources are bound back at their own paths.
_VIEW_HELPER = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    if getattr(libc, name)(*args) != 0:
        raise OSError(ctypes.get_errno(), name + ": " + os.strerror(ctypes.get_errno()))
plan = json.loads(sys.argv[1])
call("unshare", 0x00020000)
call("mount", b"none", b"/", None, 0x4000 | 0x40000, None)
held = {source: os.open(source, os.O_PATH | os.O_DIRECTORY) for source in plan["binds"]}
for path in plan["hide"]:
    call("mount", b"maxent-view", path.encode(), b"tmpfs", 0x2 | 0x4, b"mode=755,size=1m")
os.umask(0o022)
for source, fd in held.items():
    os.makedirs(source, exist_ok=True)
    call("mount", f"/proc/self/fd/{fd}".encode(), source.encode(), None, 0x1000 | 0x4000, None)
print("ready", flush=True)
sys.stdin.read()
"""


@functools.cache
def _root_view() -> int | None:
    """For a root trainer, a descriptor of the mount namespace that bwrap starts in as uid 65534.

    None when that uid can already reach every read-only source; otherwise a private mount
    namespace (nothing changes on the host) where the hidden ancestors are empty directories
    and the sources are bound back, read by a helper that exits once this holds it.
    """
    sources = [path for path in _readonly_sources() if path != "/"]
    hidden = _hidden_ancestors(sources)
    if not hidden:
        return None
    binds = [s for s in sources if any(s.startswith(h + "/") for h in hidden)]
    plan = json.dumps({"hide": hidden, "binds": binds})
    helper = subprocess.Popen(
        [interpreter(), "-I", "-S", "-c", _VIEW_HELPER, plan],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if helper.stdout.readline().strip() != "ready":
            why = (helper.communicate(timeout=10)[1].strip().splitlines() or ["no reason"])[-1]
            raise OSError(f"cannot make {', '.join(hidden)} reachable for uid 65534: {why}")
        _libc()  # loaded here: the forked child only calls setns
        return os.open(f"/proc/{helper.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        helper.kill()
        helper.communicate()


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _become_nobody(view: int | None) -> None:
    """preexec_fn part (root trainer): enter the view, then uid and gid 65534, no groups."""
    if view is not None and _libc().setns(view, _CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "setns")
    os.setgroups([])
    os.setresgid(_NOBODY, _NOBODY, _NOBODY)
    os.setresuid(_NOBODY, _NOBODY, _NOBODY)


def interpreter() -> str:
    """The base interpreter (a venv's own site-packages stays outside the sandbox)."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _bwrap_argv(limits: Limits, fds: dict[str, int]) -> list[str]:
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns"]
    argv += ["--uid", _SANDBOX_ID, "--gid", _SANDBOX_ID, "--die-with-parent", "--new-session"]
    argv += _readonly_binds() + ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", str(limits.disk_mb << 20), "--tmpfs", _BOX, "--chdir", _BOX]
    for name in ("solution", "runner"):
        if name in fds:
            argv += ["--ro-bind-data", str(fds[name]), f"{_BOX}/{name}.py"]
    if "seccomp" in fds:
        argv += ["--seccomp", str(fds["seccomp"])]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]  # writable: /box only, size-capped
    argv += ["--clearenv"]
    for key, value in {**_ENV_KEEP, "HOME": _BOX, "TMPDIR": _BOX}.items():
        argv += ["--setenv", key, value]
    return [*argv, "--", interpreter(), "-I", "-B"]


@functools.cache
def isolation_problem() -> str | None:
    """Why the bwrap sandbox cannot run here (one line), or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"the code sandbox needs Linux namespaces (this is {sys.platform})"
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed (apt-get install bubblewrap)"
    if os.geteuid() == 0:
        try:
            _root_view()
        except OSError as err:
            return f"the trainer is root and {err}"
    result = run_python("print(6 * 7)", "", Limits(wall_seconds=20))
    if result.stdout.strip() == "42":
        return None
    why = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else result.status
    return f"bwrap cannot start a sandbox here (user namespaces disabled?): {why[:200]}"


@functools.cache
def _warn_weak() -> None:
    logger.warning(
        "code_sandbox: weak: programs run with the trainer's user under an in-interpreter audit "
        "hook, which a determined program escapes (docs/code-rewards.md)"
    )


def require(isolation: str) -> None:
    """Refuse the code rewards in one line when their isolation cannot run here."""
    if isolation == "weak":
        _warn_weak()
        return
    problem = isolation_problem()
    if problem:
        raise RewardError(
            f"code rewards: {problem}; fix that, or opt into the weaker in-process sandbox "
            "with code_sandbox: weak (docs/code-rewards.md)"
        )


def _limit_child(limits: Limits, nobody: bool = False, view: int | None = None) -> None:
    """preexec_fn: runs in the child between fork and exec (no locks, no logging here).

    With ``nobody`` (bwrap started by a root trainer), it first becomes uid 65534.
    """
    if nobody:
        _become_nobody(view)
    cpu = limits.cpu_limit
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL
    memory = limits.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = limits.file_size_mb << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _collect(pipes: dict[str, int], caps: dict[str, int], deadline: float):
    """Read the pipes until they close, a cap is passed or the deadline: (data, why stopped)."""
    data = {name: bytearray() for name in pipes}
    with selectors.DefaultSelector() as selector:
        for name, fd in pipes.items():
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ, name)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return data, "timeout"
            for key, _ in selector.select(left):
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                data[key.data] += chunk
                if len(data[key.data]) > caps[key.data]:
                    return data, f"{key.data} over {caps[key.data]} bytes"
    return data, None


def run_command(
    argv: list[str],
    stdin: bytes,
    limits: Limits,
    *,
    cwd: str | None = None,
    pass_fds: tuple[int, ...] = (),
    channel: bool = False,
    nobody: bool = False,
) -> RunResult:
    """Run argv under the limits in its own session; stdout and stderr come back over pipes.

    With ``channel``, a third pipe is passed too (an argument ``{channel}`` becomes its
    descriptor) and what the child writes there comes back as ``RunResult.channel``. With
    ``nobody`` (a root trainer only), argv starts as uid and gid 65534 in ``_root_view``.
    """
    view = _root_view() if nobody else None
    names = ("stdout", "stderr", "channel") if channel else ("stdout", "stderr")
    pipes = {name: os.pipe() for name in names}
    channel_fd = str(pipes["channel"][1]) if channel else ""
    stdin_fd = _memfd("stdin", stdin)
    start = time.monotonic()
    try:
        process = subprocess.Popen(
            [channel_fd if arg == "{channel}" else arg for arg in argv],
            stdin=stdin_fd,
            stdout=pipes["stdout"][1],
            stderr=pipes["stderr"][1],
            cwd=cwd,
            env={**_ENV_KEEP, "HOME": cwd or "/", "TMPDIR": cwd or "/"},
            close_fds=True,
            pass_fds=(*pass_fds, *([pipes["channel"][1]] if channel else [])),
            start_new_session=True,  # its own process group, killed as one below
            preexec_fn=functools.partial(_limit_child, limits, nobody, view),  # noqa: PLW1509
        )
    finally:
        for _, write_end in pipes.values():
            os.close(write_end)  # only the child holds them: end of file when it ends
        os.close(stdin_fd)
    deadline = start + limits.wall_seconds
    try:
        caps = {"stdout": limits.output_chars, "stderr": 1 << 20, "channel": 1 << 20}
        reads = {name: read_end for name, (read_end, _) in pipes.items()}
        data, stopped = _collect(reads, caps, deadline)
        if stopped:
            _kill_group(process)  # past a cap or the deadline: no need to wait any longer
        try:
            returncode = process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            returncode, stopped = None, stopped or "timeout"
    finally:
        _kill_group(process)  # whatever it started dies with it
        process.wait()
        for read_end, _ in pipes.values():
            os.close(read_end)
    return _result(data, stopped, returncode, limits, time.monotonic() - start)


def _result(data, stopped: str | None, returncode, limits: Limits, seconds: float) -> RunResult:
    status = "timeout" if stopped == "timeout" else "error" if stopped else "ok"
    if status == "ok" and returncode != 0:
        status = "error"
    stderr = data["stderr"][:4000].decode("utf-8", errors="replace")
    if stopped and stopped != "timeout":
        stderr += f"\nsandbox: run ended, {stopped}"
    return RunResult(
        status=status,
        returncode=None if status == "timeout" else returncode,
        stdout=data["stdout"][: limits.output_chars].decode("utf-8", errors="replace"),
        stderr=stderr,
        seconds=seconds,
        channel=bytes(data.get("channel", b"")),
    )


def run_python(
    source: str,
    stdin: str = "",
    limits: Limits | None = None,
    *,
    runner: str | None = None,
    control: bytes = b"",
) -> RunResult:
    """Run a Python program with the given stdin in a fresh sandbox.

    With ``runner`` (a Python source), the runner is run instead, with the program beside it as
    ``solution.py`` and two descriptors as arguments: ``control`` (a memory file it reads) and
    a pipe whose content comes back as ``RunResult.channel``.
    """
    limits = limits or Limits()
    if limits.isolation == "weak":
        return _run_weak(source, stdin, limits, runner, control)
    fds = {"solution": _memfd("solution", source.encode())}
    if runner is not None:
        fds["runner"] = _memfd("runner", runner.encode())
        fds["control"] = _memfd("control", control)
    filter_ = _seccomp_filter()
    if filter_:
        fds["seccomp"] = _memfd("seccomp", filter_)
    argv = _bwrap_argv(limits, fds)
    if runner is None:
        argv.append(f"{_BOX}/solution.py")
    else:
        argv += [f"{_BOX}/runner.py", str(fds["control"]), "{channel}"]
    try:
        channel = runner is not None
        return run_command(
            argv,
            stdin.encode(),
            limits,
            pass_fds=(*fds.values(),),
            channel=channel,
            nobody=os.geteuid() == 0,  # a user namespace made by root maps to root outside
        )
    finally:
        for fd in fds.values():
            os.close(fd)


def _run_weak(source: str, stdin: str, limits: Limits, runner: str | None, control: bytes):
    """The opt-in weaker mode: a temporary directory and the audit hook of weak_sandbox."""
    tmp = tempfile.mkdtemp(prefix="maxent-sandbox-")
    control_fd = _memfd("control", control)
    try:
        Path(tmp, "solution.py").write_text(source)
        if runner is None:
            argv = weak_argv(interpreter(), tmp, "solution.py", [])
        else:
            Path(tmp, "runner.py").write_text(runner)
            argv = weak_argv(interpreter(), tmp, "runner.py", [str(control_fd), "{channel}"])
        fds = (control_fd,) if runner is not None else ()
        return run_command(
            argv, stdin.encode(), limits, cwd=tmp, pass_fds=fds, channel=runner is not None
        )
    finally:
        os.close(control_fd)
        remove_tree(tmp)


def remove_tree(path: str) -> None:
    """Remove a directory whatever the program did to it (modes, immutable flags); never raises."""
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):  # the program made something immutable or unwritable
        subprocess.run(["chattr", "-R", "-ia", path], capture_output=True, check=False)
        subprocess.run(["chmod", "-R", "u+rwx", path], capture_output=True, check=False)
        shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):
        logger.warning("code sandbox: could not remove %s", path)
