"""Wall-clock timers the product keeps on its own work, per process (a leaf: imports nothing
of the package). For example::

    with timed("checkpoint_save"):
        ...
    timings()["checkpoint_save"]  # {"calls": 3, "total_s": 0.41, "recent_s": [0.13, ...]}

bench/ reads them in the process it measures (bench/steptimer.py at exit, bench/
launcher_phases.py after prepare()) instead of wrapping our functions, so a renamed function
keeps its figure and tests/test_bench_quick.py fails when a timer is no longer recorded.
Cost: two clock reads and an append per call; memory is bounded (the last RECENT calls).
A profiler can have every block marked on its timeline: `label_blocks(record_function)`
(bench/steptimer.py does, under STEPTIMER_PROFILE); unset, it costs one test per call.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

RECENT = 1024  # calls kept per timer, for medians; the count and total cover every call


@dataclass
class _Timer:
    calls: int = 0
    total_s: float = 0.0
    recent_s: deque = field(default_factory=lambda: deque(maxlen=RECENT))

    def add(self, seconds: float) -> None:
        self.calls += 1
        self.total_s += seconds
        self.recent_s.append(seconds)


_TIMERS: dict[str, _Timer] = {}
_LABEL: Callable[[str], AbstractContextManager] | None = None


def label_blocks(factory: Callable[[str], AbstractContextManager] | None) -> None:
    """Also run every timed block inside `factory(name)` (e.g. a profiler's named range);
    None: no more."""
    global _LABEL
    _LABEL = factory


@contextmanager
def timed(name: str) -> Iterator[None]:
    """Add the time the block takes (also when it raises) to the timer `name`."""
    start = time.perf_counter()
    try:
        if _LABEL is None:
            yield
        else:
            with _LABEL(name):
                yield
    finally:
        _TIMERS.setdefault(name, _Timer()).add(time.perf_counter() - start)


def timings() -> dict[str, dict]:
    """Every timer so far: {name: {"calls", "total_s", "recent_s"}} (JSON-ready copies)."""
    return {
        name: {"calls": t.calls, "total_s": t.total_s, "recent_s": list(t.recent_s)}
        for name, t in _TIMERS.items()
    }


def reset() -> None:
    """Forget every timer (a bench measuring one phase after another)."""
    _TIMERS.clear()
