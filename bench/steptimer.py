"""Run a training script with a per-step wall-clock timer and a peak-RSS record (bench helper).

    python bench/steptimer.py SCRIPT [ARGS ...]
    accelerate launch ... bench/steptimer.py SCRIPT [ARGS ...]

The same wrapper runs our entry point (src/grpo.py) and the bare TRL script, so both carry the
same instrumentation: every transformers Trainer built in the process gets one extra
TrainerCallback that stamps `on_step_end` (wall clock: time.monotonic; CPU time of the process,
all threads: time.process_time) and keeps the `step_time` and `num_tokens` of each log.
What our parts cost (checkpoint saves, the stop callback, heartbeats, step events, the reward
guard) is what the product records in its own timers (maxent_grpo/timers.py); the bare script
times its saves into the same timer. Nothing of ours is wrapped here.
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
_RECORD: dict = {"step_end": [], "logs": [], "train_begin": None, "timers": {}}


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
