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

from maxent_grpo.methods import uses_vllm_server
from maxent_grpo.timers import timed
from maxent_grpo.train import trl_adapter

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

    class StepCallback(TrainerCallback):
        """Opens each optimizer step, times the optimizer, closes the step into the metrics."""

        def __init__(self, clock):
            self.clock = clock

        def on_step_begin(self, args, state, control, **kwargs):
            if self.clock.step_started is None:
                self.clock.step_started = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.clock.optimizer_started = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            started = self.clock.optimizer_started
            if started is not None:
                self.clock.add("training", time.perf_counter() - started)

        def on_step_end(self, args, state, control, **kwargs):
            with timed("step_time_split"):  # the split's own cost, for bench/
                self.clock.close_step()

    return StepCallback


class StepClock:
    """Component (train/components.py), every RL trainer: the `time/*` metrics of each
    optimizer step. Others report their parts through `add` (VLLMSync: sync, server_start;
    AsyncGeneration: server_generation)."""

    name = "step_clock"
    needs = ()

    def __init__(self, trainer):
        self.trainer = trainer
        self.server = uses_vllm_server(trainer.args)
        self.parts: dict[str, float] = defaultdict(float)
        self.step_started: float | None = None
        self.optimizer_started: float | None = None
        self._preparing = 0.0  # seconds of _prepare_inputs inside the current training_step
        trainer.add_callback(_callback()(self))

    def add(self, part: str, seconds: float) -> None:
        self.parts[part] += seconds

    def close_step(self) -> None:
        if self.step_started is None:
            return
        step_s = time.perf_counter() - self.step_started
        metrics = trl_adapter.metrics(self.trainer)
        for name, value in step_split(self.parts, step_s, self.server).items():
            metrics[name].append(value)
        self.parts.clear()
        self.step_started = None

    def _parts_s(self) -> float:
        return sum(self.parts.get(part, 0.0) for part in PARTS)

    def generate(self, call, prompts):
        before = self._parts_s()
        start = time.perf_counter()
        with timed("generation"):
            result = call(prompts)
        # the weight sync and the server's start TRL waits for inside _generate are their own
        inner = self._parts_s() - before
        self.add("generation", time.perf_counter() - start - inner)
        return result

    def rewards(self, call, *args):
        start = time.perf_counter()
        with timed("rewards"):
            result = call(*args)
        self.add("rewards", time.perf_counter() - start)
        return result

    def prepare_inputs(self, call, generation_batch):
        start = time.perf_counter()
        try:
            return call(generation_batch)
        finally:
            self._preparing += time.perf_counter() - start

    def training_step(self, call, *args):
        self._preparing = 0.0
        start = time.perf_counter()
        with timed("training_step"):  # the micro-batch, its input preparation included
            result = call(*args)
        self.add("training", time.perf_counter() - start - self._preparing)
        return result
