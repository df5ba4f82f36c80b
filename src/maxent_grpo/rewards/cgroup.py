"""A cgroup leaf per sandboxed run: ``memory.max`` and ``pids.max`` over everything the run
holds, kernel memory included (pipe and socket buffers, dentries, /box's pages), which no rlimit
counts.

:func:`parents` finds, once per process, where this process may make leaves: its own cgroup
v2 directory when the memory and pids controllers are delegated to it (a cgroup holding other
processes cannot enable them for children: this process then moves itself into a child of its
own first, and only when it is alone there); else, with cgroup v1, its own memory and pids
directories when it may write them (root). :func:`make` creates a run's leaf with its limits,
:func:`attach` moves the forked child into it before exec, :func:`remove` deletes it after the
run. Where none can be made the sandbox says so in one line (:func:`note`) and runs without.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from pathlib import Path

PIDS_MAX = 16  # bwrap and the program (threads and forks are refused by seccomp anyway)
_V2_CONTROLLERS = ("memory", "pids")
_counter = itertools.count()


def _mounts() -> dict[str, str]:
    """cgroup mount points: "2" for the v2 hierarchy, a v1 controller's name for its own."""
    found: dict[str, str] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ", 1)
        if len(fields) != 2:
            continue
        point, (kind, _, options) = fields[0].split()[4], fields[1].split()[:3]
        if kind == "cgroup2":
            found.setdefault("2", point)
        elif kind == "cgroup":
            for option in options.split(","):
                found.setdefault(option, point)
    return found


def _own() -> dict[str, str]:
    """This process's cgroup path per hierarchy ("2" for v2, controller names for v1)."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else ["2"]:
            paths[name] = path
    return paths


def write_control(path: str, text: str) -> None:
    """One write(2) of `text` to a kernel control file (cgroup, /proc/self/*_map): these
    take a whole value per write, so no buffered file object in between."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _v2(mount: str, path: str) -> tuple[list[str], str]:
    base = os.path.join(mount, path.lstrip("/"))
    controllers = Path(base, "cgroup.controllers").read_text().split()
    missing = [c for c in _V2_CONTROLLERS if c not in controllers]
    if missing:
        return [], f"cgroup v2 at {base}: {', '.join(missing)} not delegated to it"
    enable = " ".join(f"+{c}" for c in _V2_CONTROLLERS)
    try:
        write_control(os.path.join(base, "cgroup.subtree_control"), enable)
    except OSError:  # EBUSY: processes in it; move this one down if it is alone there
        procs = Path(base, "cgroup.procs").read_text().split()
        if procs != [str(os.getpid())]:
            return [], f"cgroup v2 at {base}: it holds other processes ({len(procs)})"
        own = os.path.join(base, f"maxent-trainer-{os.getpid()}")
        os.makedirs(own, exist_ok=True)
        write_control(os.path.join(own, "cgroup.procs"), str(os.getpid()))
        write_control(os.path.join(base, "cgroup.subtree_control"), enable)
    return [base], f"a cgroup v2 leaf per run under {base}"


def _v1(mounts: dict[str, str], own: dict[str, str]) -> tuple[list[str], str]:
    if "memory" not in mounts or "pids" not in mounts:
        return [], "no cgroup v2 with memory and pids, no cgroup v1 memory and pids either"
    bases = [os.path.join(mounts[c], own.get(c, "/").lstrip("/")) for c in ("memory", "pids")]
    if not all(os.access(base, os.W_OK) for base in bases):
        return [], f"cgroup v1 (memory, pids) not writable by uid {os.geteuid()}"
    return bases, f"a cgroup v1 leaf per run under {' and '.join(bases)}"


@functools.cache
def parents() -> tuple[tuple[str, ...], str]:
    """Where the run leaves go (empty where none can be made) and the line that says so."""
    try:
        mounts, own = _mounts(), _own()
        if "2" in mounts and "2" in own:
            bases, line = _v2(mounts["2"], own["2"])
            if bases:
                return tuple(bases), line
            v1, line_v1 = _v1(mounts, own)
            return (tuple(v1), line_v1) if v1 else ((), f"{line}; {line_v1}")
        bases, line = _v1(mounts, own)
        return tuple(bases), line
    except OSError as err:
        return (), f"no cgroup could be made ({err})"


def note() -> str | None:
    """One line for the log where no leaf can be made (None where one can)."""
    bases, line = parents()
    if bases:
        return None
    return (
        f"code sandbox: no cgroup per run ({line}): the kernel memory no rlimit counts (pipe "
        "and socket buffers, dentries of lookups) is bounded only by the open-file limit and "
        "the run's CPU time (docs/code-rewards.md)"
    )


def _limits(base: str, memory_mb: int) -> dict[str, str]:
    """The files of a leaf under base and their values (memory in bytes, no swap)."""
    memory = str(memory_mb << 20)
    if os.path.exists(os.path.join(base, "cgroup.subtree_control")):  # v2
        return {"memory.max": memory, "memory.swap.max": "0", "pids.max": str(PIDS_MAX)}
    if os.path.exists(os.path.join(base, "memory.limit_in_bytes")):  # v1 memory
        return {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory}
    return {"pids.max": str(PIDS_MAX)}  # v1 pids


def make(memory_mb: int) -> list[str]:
    """A run's leaf directories with their limits ([] where none can be made)."""
    bases, _ = parents()
    leaves = []
    name = f"maxent-run-{os.getpid()}-{next(_counter)}"
    try:
        for base in bases:
            leaf = os.path.join(base, name)
            os.mkdir(leaf)
            leaves.append(leaf)
            for file, value in _limits(base, memory_mb).items():
                if os.path.exists(os.path.join(leaf, file)):
                    write_control(os.path.join(leaf, file), value)
    except OSError:
        remove(leaves)
        raise
    return leaves


def attach(leaves: list[str]) -> None:
    """preexec_fn part: move the forked child into the leaves (before it unshares)."""
    for leaf in leaves:
        write_control(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))


def remove(leaves: list[str], seconds: float = 2.0) -> bool:
    """Delete the leaves once their processes are gone; False when one stays."""
    deadline = time.monotonic() + seconds
    for leaf in leaves:
        while True:
            try:
                os.rmdir(leaf)
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY: its last process is still being reaped
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.01)
    return True
