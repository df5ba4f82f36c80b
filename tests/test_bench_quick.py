"""Each benchmark's smallest case, so that a rename in the product or in bench/ fails `make test`
rather than the next `make bench` (which runs for minutes). Seconds each.

What needs a GPU, a vLLM server or a Slurm cluster (bench_vllm, bench_requeue, bench_launcher's
A/B runs) is imported only: a renamed import still fails here.
"""

from __future__ import annotations

import importlib
import json
import subprocess

import pytest

from helpers.paths import PYTHON, REPO
from helpers.recipes import small_recipe
from helpers.runs import child_env
from maxent_grpo.recipe import read_recipe

BENCH = REPO / "bench"
# The timers the product records and bench/ reads (maxent_grpo/timers.py).
TRAINER_TIMERS = {
    "checkpoint_save",
    "stop_callback",
    "heartbeat",
    "step_events",
    "reward_guard",
    "reward_func",
    "step_time_split",
}
PREPARE_TIMERS = {
    "prepare: read_recipe",
    "prepare: check_installed",
    "prepare: ensure_tiny_model",
    "prepare: free ports",
    "prepare: environment",
    "prepare: make_plan",
    "prepare: checks",
}


@pytest.fixture
def bench(monkeypatch):
    """Import a bench/ module by name, as its scripts import each other."""
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module


def bench_script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [PYTHON, *args], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def test_every_benchmark_imports_and_run_all_names_existing_scripts(bench):
    for name in ("bench_vllm", "bench_requeue", "bench_launcher", "bench_overhead", "run_all"):
        bench(name)
    for script, _args, _results in bench("run_all").BENCHMARKS.values():
        assert (BENCH / script).is_file(), script


def test_overhead_reads_the_product_timers_of_a_training_run(tmp_path, tiny_model, bench):
    # bench_overhead's per-process record: bench/steptimer.py around src/grpo.py (2 steps, a
    # checkpoint at step 2), then the same summary the benchmark makes of it.
    recipe = small_recipe(tmp_path, tiny_model, max_steps=2, save_steps=2)
    # With both diagnostic modes: the syncs of each step and a profile of step 2.
    timers_dir = tmp_path / "timers"
    command = [str(BENCH / "steptimer.py"), str(REPO / "src" / "grpo.py"), "--config", str(recipe)]
    modes = {"STEPTIMER_SYNCS": "1", "STEPTIMER_PROFILE": "2,2"}
    result = subprocess.run(
        [PYTHON, *command],
        cwd=REPO,
        env=child_env(STEPTIMER_OUT=str(timers_dir), **modes),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rank0 = json.loads((timers_dir / "rank0.json").read_text())
    assert TRAINER_TIMERS <= set(rank0["timers"]), rank0["timers"].keys()
    assert [s for s, *_ in rank0["step_end"]] == [1, 2]
    assert all(faults > 0 for *_, faults in rank0["step_end"])  # minor page faults so far
    summary = bench("bench_overhead").steady(
        {"wall_s": 1.0, "rank0": rank0, "peak_rss_kib": [rank0["peak_rss_kib"]]}, warmup=0
    )
    assert len(summary["save_s"]) == 1 and summary["save_s"][0] > 0
    assert summary["stop_callback_s"][0] > 0  # per step: 1 call alone, 2 with several
    assert summary["heartbeat_per_step_s"][0] > 0 and summary["step_events_per_step_s"][0] > 0
    assert summary["guard_per_step_s"][0] >= 0
    assert len(summary["page_faults"]) == 1 and summary["page_faults"][0] >= 0

    # Syncs by site: TRL's generation and the trainer's logging have some in every step; one
    # process of ours adds none (its stop check reads a file).
    syncs = bench("bench_overhead").sync_sites(rank0["syncs"], warmup=0)
    owners = {site.split("/")[0] for site in syncs["sites"]}
    assert syncs["per_step"] > 10 and {"trl", "transformers"} <= owners, syncs
    assert "maxent_grpo" not in owners, syncs
    # The profile of step 2 sees ours' actions by their timers' names.
    ranges = rank0["profile"]["ranges"]
    for action in ("stop_callback", "heartbeat", "step_events", "step_time_split"):
        assert ranges[f"timer:{action}"]["calls_per_step"] >= 1, ranges.keys()
    assert (timers_dir / "trace-rank0.json").is_file()


def test_launcher_phases_come_from_prepare_s_own_timers(tmp_path, tiny_model):
    recipe = small_recipe(tmp_path)  # the smoke recipe's model: the default tiny model's path
    result = bench_script(str(BENCH / "launcher_phases.py"), str(recipe), str(tmp_path))
    phases = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(phases["phases_s"]) >= PREPARE_TIMERS | {"prepare (total)"}
    assert phases["launcher_heavy_modules"] == []  # prepare() imports no torch/TRL
    assert phases["trainer_parse_and_check_s"] > 0


def test_reward_throughput_smallest_case(tmp_path):
    out = tmp_path / "rewards.json"
    args = ["--completions", "10", "--batch", "5", "--repeats", "1", "--code-completions", "4"]
    bench_script(str(BENCH / "bench_rewards.py"), *args, "--output", str(out))
    figures = json.loads(out.read_text())["figures"]
    assert figures and all(f["value"] > 0 for f in figures if f["unit"].endswith("/s"))


def test_runs_table_smallest_case(tmp_path):
    out = tmp_path / "runs.json"
    args = ["--runs", "6", "--steps", "5", "--big", "1", "--big-steps", "50", "--repeat", "1"]
    bench_script(str(BENCH / "bench_runs.py"), *args, "--output", str(out))
    assert json.loads(out.read_text())["wrong_states"] == {}


def test_maxent_bench_writes_a_grpo_twin_the_launcher_runs_as_grpo(tmp_path, bench):
    bench_maxent = bench("bench_maxent")
    paths = bench_maxent.recipes(tmp_path / "model", 3, tmp_path)
    # As bench_maxent.run asks: --method METHOD.
    keys = {method: read_recipe(["--config", str(paths[method])], method) for method in paths}
    assert {method: k.method for method, k in keys.items()} == {"grpo": "grpo", "maxent": "maxent"}
    assert keys["grpo"].beta == bench_maxent.KL_COEFF


def test_a_timer_counts_every_call_raising_ones_too_and_keeps_the_recent_ones(monkeypatch):
    from maxent_grpo import timers

    monkeypatch.setattr(timers, "RECENT", 2)
    timers.reset()
    for _ in range(3):
        with timers.timed("t"):
            pass
    with pytest.raises(ValueError), timers.timed("t"):
        raise ValueError
    ((name, record),) = timers.timings().items()
    assert name == "t" and record["calls"] == 4 and len(record["recent_s"]) == 2
    assert record["total_s"] >= sum(record["recent_s"]) >= 0
    timers.reset()
    assert timers.timings() == {}


def test_timed_blocks_run_inside_the_label_factory_while_one_is_set():
    from contextlib import contextmanager

    from maxent_grpo import timers

    seen = []

    @contextmanager
    def label(name):
        seen.append(f"enter {name}")
        yield
        seen.append(f"exit {name}")

    timers.label_blocks(label)
    try:
        with timers.timed("a"):
            seen.append("body")
    finally:
        timers.label_blocks(None)
    with timers.timed("b"):
        pass
    assert seen == ["enter a", "body", "exit a"]
