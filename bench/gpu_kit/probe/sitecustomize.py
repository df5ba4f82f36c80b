"""GPU kit probe: per-step stamps, TRL's step logs and peak memory of every Trainer.

Active only when GPU_KIT_PROBE_OUT is set and this folder is on PYTHONPATH (bench/gpu_kit/kit.py
does both for each training run): Python imports `sitecustomize` at start-up, in the trainer
process too, whoever started it (training.sh, the launcher, accelerate). Nothing is imported
until transformers' trainer module is: the launcher process pays nothing. Each process with a
Trainer writes GPU_KIT_PROBE_OUT/rank<RANK>.json at the end of training and at exit:

    {"step_end": [[step, seconds since start], ...], "logs": [TRL's per-step logs],
     "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 or None, "peak_rss_mib": ...}

Any sitecustomize this one shadows (the interpreter's own) is run after it.
"""

from __future__ import annotations

import atexit
import importlib.machinery
import importlib.util
import json
import os
import resource
import sys
import time

_OUT = os.environ.get("GPU_KIT_PROBE_OUT")
_HERE = os.path.dirname(os.path.abspath(__file__))
_START = time.monotonic()
_RECORD: dict = {"step_end": [], "logs": [], "train_begin_s": None}
_KEEP = ("step_time", "num_tokens", "completions/mean_length", "loss", "grad_norm", "reward")


def _write() -> None:
    torch = sys.modules.get("torch")
    peak = None
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        peak = torch.cuda.max_memory_allocated() / 2**20
    _RECORD["peak_gpu_mib"] = peak
    _RECORD["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    os.makedirs(_OUT, exist_ok=True)
    path = os.path.join(_OUT, f"rank{os.environ.get('RANK', '0')}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(_RECORD, handle)
    os.replace(path + ".tmp", path)


def _patch(module) -> None:
    from transformers import TrainerCallback

    class Probe(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            _RECORD["train_begin_s"] = time.monotonic() - _START

        def on_step_end(self, args, state, control, **kwargs):
            _RECORD["step_end"].append([state.global_step, time.monotonic() - _START])

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "step_time" in logs:
                kept = {k: logs[k] for k in _KEEP if k in logs}
                _RECORD["logs"].append({"step": state.global_step, **kept})

        def on_train_end(self, args, state, control, **kwargs):
            _write()

    init = module.Trainer.__init__

    def init_with_probe(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.add_callback(Probe())

    module.Trainer.__init__ = init_with_probe
    atexit.register(_write)


class _Finder:
    """Patches transformers.trainer right after it is first imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "transformers.trainer":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _chain() -> None:
    """Run the sitecustomize this file shadows, if any."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if _OUT:
    sys.meta_path.insert(0, _Finder())
_chain()
