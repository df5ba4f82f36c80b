"""async_generation's pieces without a server: the worker thread (its bounded wait, a failed
request), the busy-time arithmetic and the recipe's refusals. The pipeline itself runs against
the real vLLM CPU server in tests/vllm_server/test_vllm_async.py and bench/bench_async.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from maxent_grpo.errors import ConfigError
from maxent_grpo.train.async_generation import (
    GenerationWorker,
    Pending,
    ServerLostError,
    busy_seconds,
)


def test_the_worker_returns_each_request_in_order_and_records_its_time():
    seen = []

    def generate(prompts):
        seen.append(prompts)
        return [[7] * len(p) for p in prompts], None

    worker = GenerationWorker(generate, timeout=10)
    items = [Pending(step, [[1]], [[step, step]]) for step in (2, 3)]
    for item in items:
        worker.submit(item)
    assert worker.wait(items[0]) == ([[7, 7]], None)
    assert worker.wait(items[1]) == ([[7, 7]], None)
    assert seen == [[[2, 2]], [[3, 3]]]
    assert len(worker.busy) == 2 and all(end >= start for start, end in worker.busy)
    worker.close()


def test_a_server_that_stops_answering_is_an_error_after_the_timeout_not_a_hang():
    release = threading.Event()
    worker = GenerationWorker(lambda prompts: release.wait(30), timeout=0.3)
    item = Pending(4, [[1]], [[1]])
    worker.submit(item)
    started = time.monotonic()
    with pytest.raises(ServerLostError, match="did not return step 4's completions within"):
        worker.wait(item)
    assert time.monotonic() - started < 5
    release.set()
    worker.close()


def test_a_failed_request_is_raised_in_the_trainer_with_its_cause():
    def generate(prompts):
        raise ConnectionError("connection refused")

    worker = GenerationWorker(generate, timeout=10)
    item = Pending(5, [[1]], [[1]])
    worker.submit(item)
    with pytest.raises(ServerLostError, match="failed while generating step 5 ahead: .*refused"):
        worker.wait(item)
    worker.close()


def test_busy_seconds_counts_only_the_window():
    intervals = [(0.0, 1.0), (2.0, 5.0)]
    assert busy_seconds(intervals, 0.5, 3.0) == pytest.approx(1.5)
    assert busy_seconds(intervals, 5.0, 9.0) == 0.0


def grpo_config(**keys):
    from maxent_grpo.recipe.keys import GRPOConfig

    base = dict(output_dir="/tmp/x", use_cpu=True, bf16=False, report_to=[])
    base.update(use_vllm=True, vllm_mode="server", async_generation=True)
    return GRPOConfig(**{**base, **keys})


def test_async_generation_is_accepted_with_a_server_and_the_correction():
    config = grpo_config()
    assert config.async_generation and config.max_staleness == 1


@pytest.mark.parametrize(
    "keys, line",
    [
        ({"vllm_mode": "colocate"}, "needs a vLLM server"),
        ({"use_vllm": False}, "needs a vLLM server"),
        ({"vllm_importance_sampling_correction": False}, "nothing would correct for it"),
        ({"num_iterations": 2}, "one generation per optimizer step"),
        (
            {"gradient_accumulation_steps": 2, "steps_per_generation": 4},
            "one generation per optimizer step",
        ),
        ({"vllm_sync_interval_steps": 2}, "max_staleness: 1 is below vllm_sync_interval_steps"),
    ],
)
def test_async_generation_refuses_what_it_cannot_do_in_one_line(keys, line):
    with pytest.raises(ConfigError, match=line):
        grpo_config(**keys)
