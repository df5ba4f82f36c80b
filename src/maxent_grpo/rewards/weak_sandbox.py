"""The weaker sandbox a recipe may opt into (``code_sandbox: weak``) where bwrap cannot run.

The program runs with the trainer's user in a temporary directory, under ``python -I -B``, the
limits of :mod:`maxent_grpo.rewards.sandbox`, network and PID namespaces where ``unshare`` works,
and an audit hook (PEP 578) installed before it runs that refuses process creation, signals,
network connections, ctypes, raising limits and writes outside its directory. The hook lives
inside the interpreter the program controls: C modules that raise no audit event (sqlite3),
subinterpreters and editing the hook's closure escape it, and files and ``/proc`` of the machine
stay readable (docs/code-rewards.md, "What the weak mode gives up").
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
import sys

logger = logging.getLogger("maxent_grpo.rewards")

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
    _code = compile(_handle.read(), _file, "exec")
sys.argv = [_file, *sys.argv[3:]]
_install(_root)
del _install, _root, _file, _handle, _name
exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
"""


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
        "code_sandbox: weak: unshare is not allowed here, so programs run without network and "
        "PID namespaces; the audit hook still refuses network connections"
    )
    return ()


def weak_argv(python: str, root: str, main: str, extra: list[str]) -> list[str]:
    """argv running root/main under the audit hook (and unshare where allowed)."""
    return [
        *namespace_wrapper(),
        python,
        "-I",
        "-B",
        "-c",
        _BOOTSTRAP,
        root,
        f"{root}/{main}",
        *extra,
    ]
