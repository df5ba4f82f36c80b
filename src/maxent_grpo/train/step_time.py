"""Where each optimizer step's time goes, logged as metrics (and so in events.jsonl).

Per optimizer step, seconds of the main process (`time/*`):

- `generation_s`: producing completions (TRL's `_generate`: the vLLM server's or the
  training model's), without the weight sync inside it;
- `rewards_s`: scoring them (`_calculate_rewards`);
- `sync_s`: pushing the weights into vLLM (train/vllm_sync.py reports it here);
- `server_start_s`: the first generation's wait for the vLLM server to boot (/health);
- `training_s`: forward, backward (`training_step` without its input preparation) and the
  optimizer step;
- `other_s`: the rest of the step: old-policy and reference log-probabilities, data, logging;
- `waiting_s`: how long the trainers sat idle for the server: its generation time (and its
  start) with a vLLM server (`vllm_mode: server`), 0 when the trainers generate themselves;
- `step_s`: the step's wall clock (from the step's first micro-batch to its end);
- `server_busy`: the server's busy share of the step (generation + sync over step; server
  mode only; with `async_generation`, the server's request time, not the wait);
  `trainer_busy`: the trainers' ((step - waiting) / step).

The same blocks feed the product's timers (`timers.timed`: "generation", "rewards",
"training_step") for bench/.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

from maxent_grpo.timers import timed

PREFIX = "time/"
PARTS = ("generation", "rewards", "sync", "training", "server_start")


def step_split(parts: dict[str, float], step_s: float, server: bool) -> dict[str, float]:
    """One step's metrics from the seconds of its parts (pure: unit-tested)."""
    step_s = max(step_s, sum(parts.get(p, 0.0) for p in PARTS))
    generation = parts.get("generation", 0.0)
    waiting = generation + parts.get("server_start", 0.0) if server else 0.0
    metrics = {f"{PREFIX}{p}_s": parts.get(p, 0.0) for p in PARTS}
    metrics[f"{PREFIX}other_s"] = step_s - sum(parts.get(p, 0.0) for p in PARTS)
    metrics[f"{PREFIX}waiting_s"] = waiting
    metrics[f"{PREFIX}step_s"] = step_s
    if step_s > 0:
        metrics[f"{PREFIX}trainer_busy"] = (step_s - waiting) / step_s
        if server:
            # With async_generation the server generates while the trainers train: its own
            # request time (train/async_generation.py), not the trainers' wait for it.
            serving = parts.get("server_generation", generation)
            metrics[f"{PREFIX}server_busy"] = min(1.0, (serving + parts.get("sync", 0.0)) / step_s)
    return metrics


def _callback():
    from transformers import TrainerCallback  # heavy: transformers

    class StepClock(TrainerCallback):
        """Opens each optimizer step, times the optimizer, closes the step into _metrics."""

        def __init__(self, trainer):
            self.trainer = trainer

        def on_step_begin(self, args, state, control, **kwargs):
            if self.trainer._step_started is None:
                self.trainer._step_started = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.trainer._optimizer_started = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            started = self.trainer._optimizer_started
            if started is not None:
                self.trainer.add_step_time("training", time.perf_counter() - started)

        def on_step_end(self, args, state, control, **kwargs):
            with timed("step_time_split"):  # the split's own cost, for bench/
                self.trainer._close_step()

    return StepClock


class StepTimeMixin:
    """Trainer mixin: the `time/*` metrics of each optimizer step. Put it before TRL's class."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._step_parts: dict[str, float] = defaultdict(float)
        self._step_started: float | None = None
        self._optimizer_started: float | None = None
        self._preparing = 0.0  # seconds of _prepare_inputs inside the current training_step
        self.add_callback(_callback()(self))

    def add_step_time(self, part: str, seconds: float) -> None:
        self._step_parts[part] += seconds

    @contextmanager
    def _timed_part(self, part: str, timer: str):
        start = time.perf_counter()
        with timed(timer):
            yield
        self.add_step_time(part, time.perf_counter() - start)

    def _server_mode(self) -> bool:
        args = self.args
        return bool(getattr(args, "use_vllm", False)) and args.vllm_mode == "server"

    def _close_step(self) -> None:
        if self._step_started is None:
            return
        step_s = time.perf_counter() - self._step_started
        metrics = step_split(self._step_parts, step_s, self._server_mode())
        for name, value in metrics.items():
            self._metrics["train"][name].append(value)
        self._step_parts.clear()
        self._step_started = None

    def _parts_s(self) -> float:
        return sum(self._step_parts.get(part, 0.0) for part in PARTS)

    def _generate(self, *args, **kwargs):
        before = self._parts_s()
        start = time.perf_counter()
        with timed("generation"):
            result = super()._generate(*args, **kwargs)
        # the weight sync and the server's start TRL waits for inside _generate are their own
        inner = self._parts_s() - before
        self.add_step_time("generation", time.perf_counter() - start - inner)
        return result

    def _calculate_rewards(self, *args, **kwargs):
        with self._timed_part("rewards", "rewards"):
            return super()._calculate_rewards(*args, **kwargs)

    def _prepare_inputs(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return super()._prepare_inputs(*args, **kwargs)
        finally:
            self._preparing += time.perf_counter() - start

    def training_step(self, *args, **kwargs):
        self._preparing = 0.0
        start = time.perf_counter()
        with timed("training_step"):  # the micro-batch, its input preparation included
            result = super().training_step(*args, **kwargs)
        self.add_step_time("training", time.perf_counter() - start - self._preparing)
        return result
