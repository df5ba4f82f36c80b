"""Run a model's Python program so that it can neither hurt the trainer nor see its data.

Isolation is the operating system's (``isolation: "bwrap"``, the default): each run is one
bubblewrap (``bwrap``) sandbox (its parts in :mod:`maxent_grpo.rewards.bwrap`) with

- its own user, mount, PID, network, IPC, UTS and cgroup namespaces; inside, the program is uid
  and gid 65534 with no capability, ``no_new_privs`` set and nested user namespaces disabled;
  outside, it is the trainer's uid, and never root: a root trainer starts bwrap itself as uid
  and gid 65534 with no supplementary group (a user namespace maps to its creator's uid), in a
  private mount namespace where the Python installation is reachable for that uid
  (``root_view``: a Python under ``/root``, mode 700, is not);
- a new root holding only the Python installation and the system libraries, read-only, its own
  ``/proc`` and a minimal read-only ``/dev``; the working directory ``/box`` is a tmpfs capped
  at ``Limits.disk_mb`` and ``Limits.disk_inodes``: nothing of the trainer's files,
  environment or processes;
- a seccomp filter (x86-64) refusing new processes and threads, ptrace, mount, namespace and
  keyring calls, BPF, perf, io_uring, memory files and shared memory, sockets but AF_UNIX, and
  what reaches the host's files through the read-only binds (fanotify, locks, leases,
  fadvise, mincore, ...: ``bwrap._DENIED_X86_64``);
- a cgroup leaf per run where one can be made (:mod:`maxent_grpo.rewards.cgroup`: memory,
  kernel memory included, and processes), else one warning line saying so;
- rlimits set before exec (CPU, address space, file size, open files, no core files); the
  program is pid 1 of its PID namespace, and is killed through a pidfd after every run, which
  ends the namespace (``bwrap.LIFETIME``);
- no descriptor of the trainer but stdin (a sealed memory file), stdout and stderr (pipes
  that this process reads itself, bounded, with a deadline, coalescing small writes) and, for
  the unit-test runner, its two channels (the control file sealed too).

Where bwrap is missing or user namespaces are refused, :func:`require` refuses the code rewards
in one line unless the recipe opts into ``code_sandbox: weak``
(:mod:`maxent_grpo.rewards.weak_sandbox`: an audit hook inside the interpreter, which a
determined program escapes).
"""

from __future__ import annotations

import fcntl
import functools
import logging
import math
import os
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.rewards import bwrap, cgroup
from maxent_grpo.rewards.bwrap import interpreter
from maxent_grpo.rewards.common import RewardError
from maxent_grpo.rewards.weak_sandbox import weak_argv

logger = logging.getLogger("maxent_grpo.rewards")

#: Environment of a program run without bwrap (nothing of the trainer's, no tokens).
_ENV_KEEP = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
ISOLATIONS = ("bwrap", "weak")
__all__ = ["Limits", "RunResult", "interpreter", "require", "run_command", "run_python"]


@dataclass(frozen=True)
class Limits:
    """What one run may use. CPU time defaults to the wall time (rounded up) plus one second."""

    wall_seconds: float = 5.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    cpu_seconds: int | None = None
    output_chars: int = 1 << 20  # of stdout kept; more ends the run as an error
    disk_mb: int = 64  # size of the tmpfs working directory (bwrap)
    disk_inodes: int = 4096  # files and directories it may hold (bwrap)
    open_files: int = 64  # RLIMIT_NOFILE
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


_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
#: After a read of less than _SMALL_READ bytes the reader waits _COALESCE_SECONDS, or until the
#: run's process ends, before it reads again: a program writing a byte at a time costs the
#: trainer at most one wake-up per 50 ms (about 100 in a 5 s run), not one per byte.
_SMALL_READ, _COALESCE_SECONDS = 4096, 0.05


def _memfd(name: str, data: bytes) -> int:
    """A sealed memory file holding data, positioned at its start (no disk, never blocks):
    nobody, the program included, can write, grow or shrink it."""
    fd = os.memfd_create(name, os.MFD_ALLOW_SEALING)
    os.write(fd, data)  # a memory file takes all of it at once
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@functools.cache
def isolation_problem() -> str | None:
    """Why the bwrap sandbox cannot run here (one line), or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"the code sandbox needs Linux namespaces (this is {sys.platform})"
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed (apt-get install bubblewrap)"
    if os.geteuid() == 0:
        try:
            bwrap.root_view()
        except OSError as err:
            return f"the trainer is root and {err}"
    result = run_python("print(6 * 7)", "", Limits(wall_seconds=20))
    if result.stdout.strip() == "42":
        logger.info("code sandbox: bwrap; %s; %s", bwrap.LIFETIME, cgroup.parents()[1])
        if cgroup.note():
            logger.warning(cgroup.note())
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


def _limit_child(limits: Limits, box: tuple | None = None, leaves: tuple = ()) -> None:
    """preexec_fn: runs in the child between fork and exec (no locks, no logging here).

    The child first enters the run's cgroup leaves, if any; with ``box`` (bwrap runs: mount
    options, the trainer's ids, the root view), it then mounts /box's tmpfs in a mount
    namespace of its own (``bwrap.child_setup``).
    """
    cgroup.attach(list(leaves))
    if box is not None:
        bwrap.child_setup(*box)
    bwrap.limit(limits)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _collect(pipes: dict[str, int], caps: dict[str, int], deadline: float, ended=None):
    """Read the pipes until they close, a cap is passed or the deadline: (data, why stopped).

    ``ended`` (a pidfd of the run's process) ends the wait that follows a small read early."""
    data = {name: bytearray() for name in pipes}
    waiter = select.poll()
    if ended is not None:
        waiter.register(ended, select.POLLIN)
    with selectors.DefaultSelector() as selector:
        for name, fd in pipes.items():
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ, name)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                _drain(selector, data, caps)  # what came during the last wait
                return data, "timeout"
            got = 0
            for key, _ in selector.select(left):
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                got += len(chunk)
                data[key.data] += chunk
                if len(data[key.data]) > caps[key.data]:
                    return data, f"{key.data} over {caps[key.data]} bytes"
            if 0 < got < _SMALL_READ and ended is not None:
                waiter.poll(1000 * min(_COALESCE_SECONDS, max(0.0, left)))
    return data, None


def _drain(selector, data: dict[str, bytearray], caps: dict[str, int]) -> None:
    """One more read of each pipe still open, without waiting (at most its cap)."""
    for key in list(selector.get_map().values()):
        try:
            data[key.data] += os.read(key.fd, caps[key.data] + 1 - len(data[key.data]))
        except (BlockingIOError, ValueError):
            continue


def _start(argv, stdin: bytes, limits: Limits, cwd, pass_fds, names, setup, leaves=()):
    """Popen argv with its pipes: ``{channel}`` and ``{info}`` arguments become the write ends
    of those pipes. Returns (process, read ends, start time)."""
    pipes = {name: os.pipe() for name in names}
    extra = {f"{{{n}}}": w for n, (_, w) in pipes.items() if n not in ("stdout", "stderr")}
    stdin_fd = _memfd("stdin", stdin)
    start = time.monotonic()
    try:
        process = subprocess.Popen(
            [str(extra[arg]) if arg in extra else arg for arg in argv],
            stdin=stdin_fd,
            stdout=pipes["stdout"][1],
            stderr=pipes["stderr"][1],
            cwd=cwd,
            env={**_ENV_KEEP, "HOME": cwd or "/", "TMPDIR": cwd or "/"},
            close_fds=True,
            pass_fds=(*pass_fds, *extra.values()),
            start_new_session=True,  # its own process group, killed as one below
            preexec_fn=functools.partial(_limit_child, limits, setup, leaves),  # noqa: PLW1509
        )
    except BaseException:
        for read_end, _ in pipes.values():
            os.close(read_end)
        raise
    finally:
        for _, write_end in pipes.values():
            os.close(write_end)  # only the child holds them: end of file when it ends
        os.close(stdin_fd)
    return process, {name: read_end for name, (read_end, _) in pipes.items()}, start


def _box_setup(limits: Limits) -> tuple:
    """What the child of a bwrap run needs to mount /box (``bwrap.child_setup``)."""
    if os.geteuid() == 0:  # a user namespace made by root maps to root outside: uid 65534
        options = bwrap.box_options(limits.disk_mb, limits.disk_inodes, root=True)
        return options, (0, 0), bwrap.root_view()
    options = bwrap.box_options(limits.disk_mb, limits.disk_inodes, root=False)
    return options, (os.getuid(), os.getgid()), None


def run_command(
    argv: list[str],
    stdin: bytes,
    limits: Limits,
    *,
    cwd: str | None = None,
    pass_fds: tuple[int, ...] = (),
    channel: bool = False,
    box: bool = False,
) -> RunResult:
    """Run argv under the limits in its own session; stdout and stderr come back over pipes.

    With ``channel``, a third pipe is passed too (an argument ``{channel}`` becomes its
    descriptor) and what the child writes there comes back as ``RunResult.channel``. With
    ``box`` (argv is bwrap's, ``bwrap.argv``), the child mounts /box first, ``{info}`` is
    bwrap's info pipe, and the program is killed through a pidfd before this returns.
    """
    names = ["stdout", "stderr", *(["channel"] if channel else []), *(["info"] if box else [])]
    setup = _box_setup(limits) if box else None
    try:
        leaves = tuple(cgroup.make(limits.memory_mb)) if box else ()
    except OSError as err:  # the run does not start without the limits its machine can set
        return RunResult("error", None, "", f"sandbox: cannot make the run's cgroup ({err})", 0.0)
    try:
        process, reads, start = _start(argv, stdin, limits, cwd, pass_fds, names, setup, leaves)
    except BaseException:
        cgroup.remove(list(leaves))
        raise
    deadline, pidfd = start + limits.wall_seconds, None
    try:
        if box:  # bwrap names the program's pid first, before it runs
            info, _ = _collect({"info": reads.pop("info")}, {"info": 4096}, deadline)
            pidfd = bwrap.program_pidfd(bytes(info["info"]), process.pid)
        caps = {"stdout": limits.output_chars, "stderr": 1 << 20, "channel": 1 << 20}
        ended = os.pidfd_open(process.pid)
        try:
            data, stopped = _collect(reads, caps, deadline, ended)
        finally:
            os.close(ended)
        if stopped:
            _kill_group(process)  # past a cap or the deadline: no need to wait any longer
        try:
            returncode = process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            returncode, stopped = None, stopped or "timeout"
    finally:
        if not bwrap.end_program(pidfd):
            logger.warning("code sandbox: a program outlived its run (pid 1 of its namespace)")
        _kill_group(process)  # whatever it started dies with it
        process.wait()
        for read_end in reads.values():
            os.close(read_end)
        if not cgroup.remove(list(leaves)):
            logger.warning("code sandbox: a run's cgroup stayed populated: %s", leaves)
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
    filter_ = bwrap.seccomp_filter()
    if filter_:
        fds["seccomp"] = _memfd("seccomp", filter_)
    argv = bwrap.argv(fds, "{info}")
    if runner is None:
        argv.append(f"{bwrap.BOX}/solution.py")
    else:
        argv += [f"{bwrap.BOX}/runner.py", str(fds["control"]), "{channel}"]
    try:
        channel = runner is not None
        return run_command(
            argv, stdin.encode(), limits, pass_fds=(*fds.values(),), channel=channel, box=True
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
