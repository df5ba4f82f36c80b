"""Run a training script with a per-step wall-clock timer and a peak-RSS record (bench helper).

    python bench/steptimer.py SCRIPT [ARGS ...]
    accelerate launch ... bench/steptimer.py SCRIPT [ARGS ...]

The same wrapper runs our entry point (src/grpo.py) and the bare TRL script, so both carry the
same instrumentation: every transformers Trainer built in the process gets one extra
TrainerCallback that stamps `on_step_end` (wall clock: time.monotonic; CPU time of the process,
all threads: time.process_time) and keeps the `step_time` and
`num_tokens` of each log. It also times, without changing what they do: every checkpoint save
(`Trainer._save_checkpoint`, ours or HF's), the `on_step_end` and `on_log` of callbacks added
after the trainer was built (ours: the stop-request callback, the heartbeats, the step events),
every heartbeat write, and the time GuardedReward spends around the reward function itself.
At exit, each process writes $STEPTIMER_OUT/rank<RANK>.json with all of it and its peak RSS
(getrusage ru_maxrss).
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import runpy
import sys
import time
from pathlib import Path

_START = time.monotonic()
_RECORD: dict = {
    "step_end": [],
    "logs": [],
    "train_begin": None,
    "save_s": [],
    "callback_s": {},
    "guard_overhead_s": [],
    "heartbeat_s": [],
    "log_callback_s": {},
}


def _write() -> None:
    out = os.environ.get("STEPTIMER_OUT")
    if not out:
        return
    rank = os.environ.get("RANK", "0")
    _RECORD["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _RECORD["process_s"] = time.monotonic() - _START
    path = Path(out) / f"rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_RECORD))


def _install() -> None:
    import transformers
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            _RECORD["train_begin"] = time.monotonic() - _START

        def on_step_end(self, args, state, control, **kwargs):
            _RECORD["step_end"].append(
                [state.global_step, time.monotonic() - _START, time.process_time()]
            )

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "step_time" in logs:
                _RECORD["logs"].append(
                    {
                        "step": state.global_step,
                        "step_time": logs["step_time"],
                        "num_tokens": logs.get("num_tokens"),
                    }
                )

    original = transformers.Trainer.__init__

    def init_with_timer(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.add_callback(StepTimer())
        _time_saves(self)
        _time_later_callbacks(self)

    transformers.Trainer.__init__ = init_with_timer
    _time_reward_guard()
    _time_heartbeats()


def _timed(func, sink: list):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - start)

    return wrapper


def _time_saves(trainer) -> None:
    """Duration of every checkpoint save (HF's, or ours with fsync, marker and rotation)."""
    trainer._save_checkpoint = _timed(trainer._save_checkpoint, _RECORD["save_s"])


def _time_later_callbacks(trainer) -> None:
    """on_step_end and on_log of callbacks added after the trainer was built (ours: the stop
    callback, the heartbeats, the step events)."""
    add = trainer.add_callback

    def add_timed(callback):
        if not isinstance(callback, type):
            name = type(callback).__name__
            for hook, record in (("on_step_end", "callback_s"), ("on_log", "log_callback_s")):
                sink = _RECORD[record].setdefault(name, [])
                setattr(callback, hook, _timed(getattr(callback, hook), sink))
        return add(callback)

    trainer.add_callback = add_timed


def _time_reward_guard() -> None:
    """Time spent in GuardedReward around the reward function itself (ours only)."""
    try:
        from maxent_grpo.rewards import GuardedReward
    except ImportError:
        return
    call = GuardedReward.__call__

    def timed_call(self, completions, **kwargs):
        inner: list[float] = []
        func = self.func
        self.func = _timed(func, inner)
        start = time.perf_counter()
        try:
            return call(self, completions, **kwargs)
        finally:
            self.func = func
            _RECORD["guard_overhead_s"].append(time.perf_counter() - start - sum(inner))

    GuardedReward.__call__ = timed_call


def _time_heartbeats() -> None:
    """Every heartbeat write (ours only: at each step end and around each generation)."""
    try:
        from maxent_grpo.rundir.heartbeat import Heartbeat
    except ImportError:
        return
    Heartbeat.beat = _timed(Heartbeat.beat, _RECORD["heartbeat_s"])


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    script = os.path.abspath(sys.argv[1])
    sys.argv = [script, *sys.argv[2:]]
    sys.path[0] = os.path.dirname(script)  # as `python SCRIPT` would have it
    atexit.register(_write)
    _install()
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
