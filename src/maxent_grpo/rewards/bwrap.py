"""The bubblewrap sandbox's parts: its arguments, its seccomp filter, the child's setup between
fork and exec, the root trainer's view of the installation, and the end of every run.

Lifetime (:data:`LIFETIME`): the program is pid 1 of its own PID namespace (``--as-pid-1``: no
bubblewrap init there that it could take over through ``/proc/1/mem``); it cannot clear its
parent-death signal nor become undumpable (seccomp); and after every run the trainer kills it
through a pidfd opened when it started (bwrap's ``--info-fd`` names it), which ends every
process of the namespace, then waits for it. Each run is also a cgroup leaf of its own where
one can be made (:mod:`maxent_grpo.rewards.cgroup`).

Memory: ``RLIMIT_AS``; no memory files, SysV/POSIX shared memory or message queues, pipes
past 64 KiB (seccomp); ``/dev`` read-only (no ``/dev/shm``); at most ``Limits.open_files``
descriptors; and ``/box`` a tmpfs that the child mounts itself, in a mount namespace of its
own, with both a size and an inode cap (bubblewrap's ``--tmpfs`` takes no inode cap), gone
with the run.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import platform
import resource
import select
import selectors
import signal
import site
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

from maxent_grpo.rewards.cgroup import write_control

_SANDBOX_ID = "65534"  # uid and gid of the program inside its user namespace ("nobody")
NOBODY = 65534  # and outside it, when the trainer is root
BOX = "/box"  # the program's working directory inside the sandbox
_BOX_MOUNT = b"/tmp"  # where the child mounts /box's tmpfs, in its own mount namespace
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": BOX, "TMPDIR": BOX}
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000

# x86-64 system calls the program gets EPERM for: processes and threads (clone, clone3, fork,
# vfork), other processes' memory, mounts (old and new API) and namespaces, keyrings, kernel
# modules, BPF, perf, userfaultfd, io_uring, personality; memory no rlimit counts: memfd_create,
# memfd_secret, shmget, msgget, mq_open; and what reaches the host's files through the read-only
# binds: inotify, fanotify, flock, fadvise64, readahead, mincore, cachestat, sync, syncfs,
# sync_file_range, process_madvise, setting or removing xattrs. Numbers: the kernel's
# syscall_64.tbl.
_DENIED_X86_64 = (56, 57, 58, 435, 101, 310, 311, 165, 166, 155, 161, 272, 308, 248, 249, 250)
_DENIED_X86_64 += (175, 176, 313, 246, 320, 321, 298, 323, 425, 426, 427, 135, 303, 304)
_DENIED_X86_64 += (319, 447, 29, 68, 240, 253, 254, 294, 428, 429, 430, 431, 432, 433, 442)
_DENIED_X86_64 += (300, 301, 73, 221, 187, 27, 451, 162, 306, 277, 440)
_DENIED_X86_64 += (188, 189, 190, 197, 198, 199, 463, 466)
_AF_UNIX = 1
# Calls refused for some values of one argument: (number, argument, values refused). prctl:
# PR_SET_PDEATHSIG, PR_SET_DUMPABLE (it would outlive bwrap, or hide its /proc from a trainer of
# the same uid); fcntl: the lock commands (F_GETLK, F_SETLK, F_SETLKW and the OFD ones), leases,
# dnotify (F_NOTIFY) and F_SETPIPE_SZ (a pipe's buffer stays 64 KiB); madvise: MADV_COLD and
# MADV_PAGEOUT (out of the page cache, for files the trainer's uid owns).
_ARGUMENT_DENIED = (
    (157, 0, (1, 4)),
    (72, 1, (5, 6, 7, 36, 37, 38, 1024, 1025, 1026, 1031)),
    (28, 2, (20, 21)),
)
# Calls allowed for one value of an argument only: socket and socketpair, AF_UNIX (no vsock,
# packet, netlink, inet, alg, bluetooth, ...: their port spaces or kernel state are not all
# the network namespace's).
_ARGUMENT_ONLY = ((41, 0, (_AF_UNIX,)), (53, 0, (_AF_UNIX,)))
_EPERM, _ALLOW = 0x00050001, 0x7FFF0000  # SECCOMP_RET_ERRNO | EPERM, SECCOMP_RET_ALLOW

#: How a run's processes and memory end, in one line (logged once by ``require``).
LIFETIME = (
    "the program is pid 1 of its own PID namespace, killed through a pidfd after each run "
    "(the whole namespace with it); memory: RLIMIT_AS, no memfd/shared memory (seccomp), "
    "open files and /box's size and inodes capped"
)


def _argument_block(number: int, argument: int, values: tuple, listed: int) -> list:
    """Instructions for one call checked by one argument (its low 32 bits): a listed value
    returns `listed`, any other the opposite; another call skips the block."""
    other = _ALLOW if listed == _EPERM else _EPERM
    body = [(0x20, 0, 0, 16 + 8 * argument)]
    for value in values:
        body += [(0x15, 0, 1, value), (0x06, 0, 0, listed)]
    body.append((0x06, 0, 0, other))
    return [(0x15, 0, len(body), number), *body]


def seccomp_filter() -> bytes:
    """A classic-BPF seccomp program (struct sock_filter array), or b"" off x86-64."""
    if platform.machine() != "x86_64":
        return b""
    ins = [(0x20, 0, 0, 4), (0x15, 1, 0, 0xC000003E), (0x06, 0, 0, 0x80000000)]  # arch or kill
    ins += [(0x20, 0, 0, 0), (0x35, 0, 1, 0x40000000), (0x06, 0, 0, _EPERM)]  # x32: EPERM
    for number in _DENIED_X86_64:
        ins += [(0x15, 0, 1, number), (0x06, 0, 0, _EPERM)]
    for number, argument, values in _ARGUMENT_DENIED:
        ins += _argument_block(number, argument, values, _EPERM)
    for number, argument, values in _ARGUMENT_ONLY:
        ins += _argument_block(number, argument, values, _ALLOW)
    ins.append((0x06, 0, 0, _ALLOW))
    return b"".join(struct.pack("<HBBI", *i) for i in ins)


def interpreter() -> str:
    """The base interpreter (a venv's own site-packages stays outside the sandbox)."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def readonly_sources() -> list[str]:
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
    for path in readonly_sources():
        args += ["--ro-bind", path, path]
    for path in site.getsitepackages([sys.base_prefix]):
        if os.path.isdir(path):
            args += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
    return args


def argv(fds: dict[str, int], info: str) -> list[str]:
    """bwrap's command line; ``info`` becomes the descriptor bwrap names the program's pid on."""
    args = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--as-pid-1"]
    args += ["--uid", _SANDBOX_ID, "--gid", _SANDBOX_ID, "--die-with-parent", "--new-session"]
    args += ["--info-fd", info, *_readonly_binds(), "--proc", "/proc", "--dev", "/dev"]
    args += ["--bind", _BOX_MOUNT.decode(), BOX, "--chdir", BOX]
    for name in ("solution", "runner"):
        if name in fds:
            args += ["--ro-bind-data", str(fds[name]), f"{BOX}/{name}.py"]
    if "seccomp" in fds:
        args += ["--seccomp", str(fds["seccomp"])]
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--clearenv"]  # writable: /box only
    for key, value in _ENV.items():
        args += ["--setenv", key, value]
    return [*args, "--", interpreter(), "-I", "-B"]


# ---- the root trainer's view of the installation ------------------------------------------


def _searchable_by_nobody(path: str) -> bool:
    info = os.stat(path)
    if info.st_uid == NOBODY:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == NOBODY:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def hidden_ancestors(sources: list[str]) -> list[str]:
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
_VIEW_SECONDS = 10.0  # the helper makes one unshare and a few mounts


def _first_line(fd: int, seconds: float) -> bytes:
    """The first line written on fd, waiting at most `seconds` (b"" on end of file or time)."""
    data, deadline = b"", time.monotonic() + seconds
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while b"\n" not in data and (left := deadline - time.monotonic()) > 0:
            if selector.select(left):
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                data += chunk
    return data.split(b"\n", 1)[0] if b"\n" in data else b""


@functools.cache
def root_view() -> int | None:
    """For a root trainer, a descriptor of the mount namespace that bwrap starts in as uid 65534.

    None when that uid can already reach every read-only source; otherwise a private mount
    namespace (nothing changes on the host) where the hidden ancestors are empty directories
    and the sources are bound back, read by a helper that exits once this holds it.
    """
    sources = [path for path in readonly_sources() if path != "/"]
    hidden = hidden_ancestors(sources)
    if not hidden:
        return None
    binds = [s for s in sources if any(s.startswith(h + "/") for h in hidden)]
    plan = json.dumps({"hide": hidden, "binds": binds})
    helper = subprocess.Popen(
        [interpreter(), "-I", "-S", "-c", _VIEW_HELPER, plan],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        if _first_line(helper.stdout.fileno(), _VIEW_SECONDS).strip() != b"ready":
            helper.kill()
            err = helper.communicate(timeout=_VIEW_SECONDS)[1].decode(errors="replace")
            why = (err.strip().splitlines() or [f"no answer within {_VIEW_SECONDS:g} s"])[-1]
            raise OSError(f"cannot make {', '.join(hidden)} reachable for uid 65534: {why}")
        libc()  # loaded here: the forked child only calls it
        return os.open(f"/proc/{helper.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        helper.kill()
        helper.communicate()


@functools.cache
def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


# ---- the child, between fork and exec -----------------------------------------------------


def box_options(disk_mb: int, inodes: int, root: bool) -> bytes:
    owner = f",uid={NOBODY},gid={NOBODY}" if root else ""
    return f"size={disk_mb << 20},nr_inodes={inodes},mode=0700{owner}".encode()


def _call(name: str, *args) -> None:
    if getattr(libc(), name)(*args) != 0:
        raise OSError(ctypes.get_errno(), name)


def child_setup(options: bytes, ids: tuple[int, int], view: int | None) -> None:
    """preexec_fn part (no locks, no logging): a mount namespace of its own holding /box's
    tmpfs; a root trainer's child enters the view first and ends as uid and gid 65534, another
    trainer's child maps its own ids into a user namespace of its own to mount it."""
    uid, gid = ids
    if uid == 0:
        if view is not None:
            _call("setns", view, _CLONE_NEWNS)
        _call("unshare", _CLONE_NEWNS)
    else:
        _call("unshare", _CLONE_NEWUSER | _CLONE_NEWNS)
        write_control("/proc/self/setgroups", "deny")
        write_control("/proc/self/uid_map", f"{uid} {uid} 1")
        write_control("/proc/self/gid_map", f"{gid} {gid} 1")
    _call("mount", b"none", b"/", None, _MS_REC | _MS_PRIVATE, None)
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    _call("mount", b"maxent-box", _BOX_MOUNT, b"tmpfs", flags, options)
    if uid == 0:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)


# ---- the end of a run ---------------------------------------------------------------------


def program_pidfd(info: bytes, bwrap_pid: int) -> int | None:
    """A pidfd of the program (bwrap's ``child-pid``), once checked to be bwrap's child."""
    try:
        pid = json.loads(info.decode())["child-pid"]
        pidfd = os.pidfd_open(int(pid))
    except (ValueError, KeyError, TypeError, OSError):
        return None  # never started, or already gone (reaped by bwrap)
    try:
        with open(f"/proc/{pid}/status") as status:
            ppid = next(int(line.split()[1]) for line in status if line.startswith("PPid:"))
    except (OSError, StopIteration, ValueError):
        ppid = None
    if ppid != bwrap_pid:  # bwrap (not yet reaped by us) is no longer its parent: not ours
        os.close(pidfd)
        return None
    return pidfd


def end_program(pidfd: int | None, seconds: float = 5.0) -> bool:
    """SIGKILL the program through its pidfd and wait for it to be gone: pid 1 of its PID
    namespace, so the kernel ends every process there first. True when it is gone."""
    if pidfd is None:
        return True
    try:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            return True
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(seconds * 1000))
    finally:
        os.close(pidfd)


def limit(limits) -> None:
    """preexec_fn part: the run's rlimits (CPU, address space, file size, descriptors, no
    message-queue bytes, no core file)."""
    cpu = limits.cpu_limit
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL
    memory = limits.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = limits.file_size_mb << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
