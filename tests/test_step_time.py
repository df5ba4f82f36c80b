"""Per-step time accounting (train/step_time.py) and how runs / plot show it. Fast: no model."""

from __future__ import annotations

import time
from collections import defaultdict
from types import SimpleNamespace

import pytest

from maxent_grpo.rundir.events import emit, read_events
from maxent_grpo.runs.plot import draw, history_from_events
from maxent_grpo.runs.table import time_split
from maxent_grpo.train.step_time import StepClock, step_split
from maxent_grpo.train.trl_adapter import HOOKS, chain


def test_step_split_with_a_server():
    parts = {"generation": 6.0, "rewards": 0.5, "sync": 0.5, "training": 2.0}
    metrics = step_split(parts, 10.0, server=True)
    assert metrics["time/other_s"] == pytest.approx(1.0)
    assert metrics["time/waiting_s"] == 6.0  # the trainers wait while the server generates
    assert metrics["time/trainer_busy"] == pytest.approx(0.4)
    assert metrics["time/server_busy"] == pytest.approx(0.65)  # generation + sync


def test_the_servers_start_is_waiting_not_generation():
    parts = {"server_start": 70.0, "generation": 2.0, "training": 1.0}
    metrics = step_split(parts, 74.0, server=True)
    assert metrics["time/server_start_s"] == 70.0 and metrics["time/generation_s"] == 2.0
    assert metrics["time/waiting_s"] == 72.0
    assert metrics["time/server_busy"] == pytest.approx(2.0 / 74.0)


def test_step_split_generating_in_the_trainers():
    metrics = step_split({"generation": 3.0, "training": 1.0}, 5.0, server=False)
    assert metrics["time/waiting_s"] == 0.0 and metrics["time/trainer_busy"] == 1.0
    assert "time/server_busy" not in metrics
    assert metrics["time/sync_s"] == 0.0 and metrics["time/other_s"] == pytest.approx(1.0)


def test_parts_never_exceed_the_step():
    metrics = step_split({"generation": 2.0, "training": 1.5}, 3.0, server=False)
    assert metrics["time/step_s"] == 3.5 and metrics["time/other_s"] == 0.0


class FakeTRL:
    """The TRL methods the step clock times: each sleeps a known time. They call each other
    through the chains of the clock's hooks, as train/trl_adapter.py's HookedTrainer does."""

    def __init__(self):
        self.args = SimpleNamespace(use_vllm=True, vllm_mode="server")
        self._metrics = {"train": defaultdict(list)}
        self.callbacks = []
        self.clock = StepClock(self)
        for hook, method in HOOKS.items():
            own = getattr(self, f"trl_{hook.lstrip('_')}", None)
            if own is not None:
                setattr(self, hook, chain([self.clock], method, own))

    def add_callback(self, callback):
        self.callbacks.append(callback)

    def trl_generate(self, prompts):
        time.sleep(0.05)
        for part in ("sync", "server_start"):  # train/vllm_sync.py reports these, inside
            time.sleep(0.01)
            self.clock.add(part, 0.01)
        return prompts

    def trl_calculate_rewards(self, *args):
        time.sleep(0.01)

    def trl_prepare_inputs(self, batch):
        self._generate(batch)
        self._calculate_rewards()
        return batch

    def trl_training_step(self, model, inputs, n):
        self._prepare_inputs(inputs)
        time.sleep(0.03)  # forward and backward


def test_the_clock_splits_one_optimizer_step():
    trainer = FakeTRL()
    (callback,) = trainer.callbacks
    callback.on_step_begin(None, None, None)
    for _ in range(2):  # two micro-batches
        trainer.training_step(None, [1], 1)
    callback.on_pre_optimizer_step(None, None, None)
    time.sleep(0.01)
    callback.on_optimizer_step(None, None, None)
    callback.on_step_end(None, None, None)
    m = {k: v[0] for k, v in trainer._metrics["train"].items()}
    assert m["time/generation_s"] == pytest.approx(0.1, abs=0.04)  # the sync is not in it
    assert m["time/sync_s"] == m["time/server_start_s"] == pytest.approx(0.02)
    assert m["time/rewards_s"] == pytest.approx(0.02, abs=0.02)
    assert m["time/training_s"] == pytest.approx(0.07, abs=0.04)  # 2 x 0.03 + optimizer
    parts = sum(m[k] for k in m if k.endswith("_s") and k not in ("time/step_s", "time/waiting_s"))
    assert parts == pytest.approx(m["time/step_s"])
    assert 0 < m["time/server_busy"] < 1 and 0 < m["time/trainer_busy"] < 1
    assert trainer.clock.parts == {}  # the next step starts from zero


class AsyncFakeTRL(FakeTRL):
    """async_generation reports the server's own request time from inside _generate."""

    def trl_generate(self, prompts):
        self.clock.add("server_generation", 0.04)
        return super().trl_generate(prompts)


def test_with_async_generation_the_server_busy_share_is_its_request_time():
    trainer = AsyncFakeTRL()
    (callback,) = trainer.callbacks
    callback.on_step_begin(None, None, None)
    trainer.training_step(None, [1], 1)
    callback.on_step_end(None, None, None)
    m = {k: v[0] for k, v in trainer._metrics["train"].items()}
    # The trainers' wait is what _generate took; the server's request time is not taken off it.
    assert m["time/generation_s"] >= 0.045
    assert 0 < m["time/trainer_busy"] < 1
    assert m["time/server_busy"] == pytest.approx((0.04 + 0.01) / m["time/step_s"])


STEP = {
    "time/generation_s": 2.0,
    "time/rewards_s": 0.2,
    "time/training_s": 1.5,
    "time/sync_s": 0.1,
    "time/other_s": 0.2,
    "time/waiting_s": 2.0,
    "time/step_s": 4.0,
    "time/trainer_busy": 0.5,
    "time/server_busy": 0.525,
}


def test_runs_shows_the_last_steps_split():
    assert time_split(STEP) == (
        "time: 4s/step, gen 50% rewards 5% train 38% sync 2% other 5%; "
        "busy: trainers 50%, server 52%"
    )


def test_plot_draws_the_time_split(tmp_path):
    for step in (1, 2, 3):
        emit(tmp_path, "step", step=step, metrics={"reward": 0.1 * step, **STEP})
    history = history_from_events(read_events(tmp_path))
    titles = draw(history, tmp_path / "p.png", "run")
    assert "Time per step" in titles and "Busy share" in titles
    assert (tmp_path / "p.png").stat().st_size > 0
