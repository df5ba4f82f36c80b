"""A trainer process's start-up, made cheaper: Python's cyclic garbage collector held, and the
installed-package scan done once (every start and every requeue pays both, in each process).

- Importing torch, transformers, TRL and datasets creates ~700k objects that live for the whole
  run. With the collector on, each time the heap grows by a quarter Python walks all of them
  (7-10 full collections during start-up), and accelerate runs one more full collection
  when training starts (free_memory): about 0.4 s for each walk here. Held from the start of
  cli_main to the trainer's first step, then one collection (what free_memory did, so no
  start-up garbage cycle is kept), `gc.freeze()` of the survivors (never walked again: they
  live for the run) and the collector on again, for the training loop as before.
- transformers and TRL each call `importlib.metadata.packages_distributions()` when imported
  (0.4-0.6 s each: it parses the metadata of every installed distribution); within start-up the
  second call gets a copy of the first one's answer (nothing is installed in between), and
  the answer is kept on disk (${XDG_CACHE_HOME:-~/.cache}/maxent-grpo/), keyed by every
  sys.path entry's identity and modification time: installing or removing a package changes
  its directory's, so a later start (a requeue's trainers, each of them) reads the answer
  instead of scanning, and any change to the environment scans again.

- torch records where each operator is registered with `inspect.getframeinfo`, which reads the
  source file and walks every loaded module to find the caller's (134 times in a trainer,
  0.26-0.42 s at load 7, the later calls dearest). During start-up, `torch._library.utils`
  gets a `get_source` that reads the same file name and line off the frame.

`starting_up()` wraps a process's start; `started()` ends it early (before training). Leaving
the block restores what it changed, so an in-process caller (a test) gets its own state back.
A process forked during start-up (vLLM's engine in colocate mode may be) runs with the
collector on, as it would have.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_real_scan = importlib.metadata.packages_distributions
_held = False  # whether this module holds the collector now


def _scan_once() -> dict[str, list[str]]:
    """packages_distributions() answered from one scan; each caller gets its own copy."""
    return {package: list(names) for package, names in _cached_scan().items()}


@functools.cache
def _cached_scan() -> dict[str, list[str]]:
    path = _scan_file()
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    answer = _real_scan()
    try:  # a unique temporary name, then an atomic rename: trainers start together
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(answer))
        os.replace(tmp, path)
    except OSError:  # a read-only home: scan at every start, as before
        pass
    return answer


def _scan_file() -> Path:
    """Where the scan of this environment is kept: the name hashes the interpreter and each
    sys.path entry with its inode, size and modification time (a package installed or removed
    changes its directory's)."""
    parts = [sys.executable]
    for entry in sys.path:
        try:
            st = os.stat(entry or ".")
            parts.append(f"{entry}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{entry}:-")
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "maxent-grpo" / f"packages-{key}.json"


def op_source(stacklevel: int) -> str:
    """torch._library.utils.get_source without inspect: "file:line" of the frame stacklevel
    above the caller (the same string for a module's code; no file read, no module walk)."""
    frame = sys._getframe(stacklevel)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class _CheapOpSource(importlib.abc.MetaPathFinder):
    """Loads torch._library.utils as usual, then swaps in op_source (when the torch of the day
    still has a get_source to swap)."""

    name = "torch._library.utils"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        _forget_finder()
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader_exec = spec.loader.exec_module

        def exec_module(module) -> None:
            loader_exec(module)
            if callable(getattr(module, "get_source", None)):
                module.get_source = op_source

        spec.loader.exec_module = exec_module
        return spec


_finder = _CheapOpSource()


def _forget_finder() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def started() -> None:
    """End start-up before training: collect once, freeze the survivors, collector on."""
    _restore(collect=True)


def _restore(collect: bool) -> None:
    global _held
    _forget_finder()
    importlib.metadata.packages_distributions = _real_scan
    _cached_scan.cache_clear()
    if _held:
        if collect:
            gc.collect()
            gc.freeze()
        gc.enable()
        _held = False


os.register_at_fork(after_in_child=lambda: _restore(collect=False))


@contextmanager
def starting_up() -> Iterator[None]:
    """The process's start-up, until started() or the end of the block. Leaving the block
    (after training, or on an error before it: then without the collection) turns the
    collector back on and unfreezes: a caller that goes on, a test, gets its collector back."""
    global _held
    _held = gc.isenabled()
    if _held:
        gc.disable()
    importlib.metadata.packages_distributions = _scan_once
    if _CheapOpSource.name not in sys.modules:
        sys.meta_path.insert(0, _finder)
    try:
        yield
    finally:
        _restore(collect=False)
        gc.unfreeze()
