"""Run a training script with a per-step wall-clock timer and a peak-RSS record (bench helper).

    python bench/steptimer.py SCRIPT [ARGS ...]
    accelerate launch ... bench/steptimer.py SCRIPT [ARGS ...]

The same wrapper runs our entry point (src/grpo.py) and the bare TRL script, so both carry the
same instrumentation: every transformers Trainer built in the process gets one extra
TrainerCallback that stamps `on_step_end` (wall clock: time.monotonic; CPU time of the process,
all threads: time.process_time; minor page faults so far: getrusage ru_minflt) and keeps the
`step_time` and `num_tokens` of each log.
What our parts cost (checkpoint saves, the stop callback, heartbeats, step events, the reward
guard) is what the product records in its own timers (maxent_grpo/timers.py); the bare script
times its saves into the same timer. Nothing of ours is wrapped here.
At exit, each process writes $STEPTIMER_OUT/rank<RANK>.json with all of it and its peak RSS
(getrusage ru_maxrss).

Two diagnostic modes (their runs are not for timing):
- STEPTIMER_SYNCS=1: the host-device synchronisations of each step, by call site
  (bench/sync_counter.py), in the record's "syncs": [[step, {site: count}], ...].
- STEPTIMER_PROFILE=FIRST,LAST: torch.profiler over steps FIRST..LAST (CUDA too on a GPU), with
  every block the product times (maxent_grpo/timers.py) marked as a range `timer:<name>`: the
  record's "profile" holds each range's calls and CPU (and CUDA) milliseconds, and the ops that
  synchronise (aten::_local_scalar_dense: `.item()`; cudaStreamSynchronize, ...); the trace
  is written beside it (trace-rank<RANK>.json, for chrome://tracing or Perfetto).
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
_RECORD: dict = {"step_end": [], "logs": [], "train_begin": None, "timers": {}}
_BENCH = os.path.dirname(os.path.abspath(__file__))
# Ops that make the host wait for the device (CPU: the calls that would on a GPU).
SYNC_OPS = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize")


def _write() -> None:
    out = os.environ.get("STEPTIMER_OUT")
    if not out:
        return
    rank = os.environ.get("RANK", "0")
    from maxent_grpo.timers import timings

    _RECORD["timers"] = timings()
    _RECORD["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _RECORD["process_s"] = time.monotonic() - _START
    path = Path(out) / f"rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_RECORD))


def _threads() -> dict:
    """Python threads by name, and the process's threads of any kind (OpenMP, gloo, ...)."""
    import threading

    try:
        native = len(os.listdir("/proc/self/task"))
    except OSError:
        native = None
    return {"python": sorted(t.name for t in threading.enumerate()), "all": native}


def _sync_counter():
    if os.environ.get("STEPTIMER_SYNCS") != "1":
        return None
    sys.path.insert(0, _BENCH)
    from sync_counter import SyncCounter

    _RECORD["syncs"] = []
    return SyncCounter()


class _Profile:
    """torch.profiler over the steps FIRST..LAST of STEPTIMER_PROFILE: from the end of step
    FIRST - 1 to the end of step LAST (as the step stamps: each step with its callbacks)."""

    def __init__(self, spec: str):
        self.first, self.last = (int(x) for x in spec.split(","))
        if not 2 <= self.first <= self.last:
            sys.exit(f"STEPTIMER_PROFILE={spec}: want FIRST,LAST with 2 <= FIRST <= LAST")
        self.profiler = None

    def step_end(self, step: int) -> None:
        if step == self.first - 1:
            self._start()
        elif step == self.last and self.profiler is not None:
            self._stop()

    def _start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function

        from maxent_grpo import timers

        timers.label_blocks(lambda name: record_function(f"timer:{name}"))
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.profiler = profile(activities=activities)
        self.profiler.start()

    def _stop(self) -> None:
        from maxent_grpo import timers

        self.profiler.stop()
        timers.label_blocks(None)
        steps = self.last - self.first + 1
        ranges = {}
        for event in self.profiler.key_averages():
            if event.key.startswith("timer:") or event.key in SYNC_OPS:
                ranges[event.key] = {
                    "calls_per_step": event.count / steps,
                    "cpu_ms_per_step": event.cpu_time_total / 1e3 / steps,
                    "device_ms_per_step": getattr(event, "device_time_total", 0.0) / 1e3 / steps,
                }
        _RECORD["profile"] = {"steps": [self.first, self.last], "ranges": ranges}
        out = os.environ.get("STEPTIMER_OUT")
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            rank = os.environ.get("RANK", "0")
            self.profiler.export_chrome_trace(str(Path(out) / f"trace-rank{rank}.json"))


def _install() -> None:
    import transformers
    from transformers import TrainerCallback

    counter = _sync_counter()
    spec = os.environ.get("STEPTIMER_PROFILE")
    profile = _Profile(spec) if spec else None

    class StepTimer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            _RECORD["train_begin"] = time.monotonic() - _START
            if counter is not None:  # from here: the trainer is built, its device set
                _RECORD["syncs_mode"] = counter.install()

        def on_step_end(self, args, state, control, **kwargs):
            if not _RECORD["step_end"]:  # what shares this process's time with the steps
                _RECORD["threads"] = _threads()
            _RECORD["step_end"].append(
                [
                    state.global_step,
                    time.monotonic() - _START,
                    time.process_time(),
                    resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
                ]
            )
            if profile is not None:
                profile.step_end(state.global_step)
            if counter is not None:
                # Logging (TRL's .item() of the loss) comes after on_step_end: counted in the
                # next step, on both sides alike.
                _RECORD["syncs"].append([state.global_step, counter.take()])

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

    transformers.Trainer.__init__ = init_with_timer


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
