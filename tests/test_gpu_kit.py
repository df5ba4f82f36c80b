"""The GPU proof kit (scripts/gpu_kit.sh): its package list, its parts, and its CPU run.

The CPU runs (marker gpukit, `make test-gpu-kit`) run every step of the kit on the tiny model
and check the table and the JSON, so the kit cannot rot between GPU loans, and run its signal
step once more with resume broken (the failpoint resume_restart: the trainer starts from
scratch instead of resuming), which must fail. The two kit runs go side by side (about 2
min on a quiet machine). They run only with MAXENT_GRPO_GPU_KIT_TESTS=1 (the Makefile target
sets it): `make test` skips them. The other tests are quick, offline, and in the default suite.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from helpers.paths import REPO

spec = importlib.util.spec_from_file_location("packages", REPO / "bench/gpu_kit/packages.py")
packages = importlib.util.module_from_spec(spec)
spec.loader.exec_module(packages)
sys.path.insert(0, str(REPO / "bench" / "gpu_kit"))
try:
    import kit
    import kit_model
    import kit_runs
    import report
finally:
    sys.path.pop(0)


def fake_wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = "Metadata-Version: 2.1\nName: x\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def test_the_kit_carries_our_pins_and_nothing_the_machine_has():
    kit = packages.kit()
    pins = packages.pyproject_pins()
    for name in ("trl", "datasets", "math-verify", "deepspeed"):
        assert kit[name] == pins[name]
    assert not set(kit) & packages.MACHINE_HAS
    # The machine has what the kit does not carry and the runs need.
    assert {"torch", "transformers", "accelerate", "peft", "pyyaml"} <= packages.MACHINE_HAS
    assert {"vllm", "wandb", "submitit"}.isdisjoint(kit)


def test_the_needs_are_the_versions_our_environment_resolved():
    for name, version in packages.NEEDS.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # not in this environment (e.g. DeepSpeed's needs without the extra)
        assert installed == version, name


def test_unmet_needs_are_those_neither_the_kit_nor_the_machine_meets(tmp_path):
    wheels = [
        fake_wheel(tmp_path, "trl", "1.16.0", ["datasets>=4", "torch", "vllm; extra == 'vllm'"]),
        fake_wheel(tmp_path, "datasets", "5.2.0", ["dill<0.4.2", "no_such_pkg>=1"]),
        fake_wheel(tmp_path, "other", "1.0", ["old_only; python_version < '3.10'"]),
    ]
    assert packages.unmet(wheels) == [
        "datasets-5.2.0-py3-none-any.whl: dill<0.4.2",
        "datasets-5.2.0-py3-none-any.whl: no_such_pkg>=1",
    ]


def test_missing_and_stale_wheels(tmp_path):
    fake_wheel(tmp_path, "trl", "1.16.0", [])
    fake_wheel(tmp_path, "dill", "0.3.8", [])  # another version than the kit's
    fake_wheel(tmp_path, "left_over", "1.0", [])
    missing = packages.missing(tmp_path)
    assert "trl==1.16.0" not in missing
    assert f"dill=={packages.NEEDS['dill']}" in missing
    assert len(missing) == len(packages.kit()) - 1
    assert [p.name for p in packages.stale(tmp_path)] == [
        "dill-0.3.8-py3-none-any.whl",
        "left_over-1.0-py3-none-any.whl",
    ]


def test_setup_env_with_the_current_environment_installs_nothing(tmp_path):
    env = {**os.environ, "MAXENT_GRPO_ENV": "current", "PATH": "/usr/bin:/bin"}
    script = ["bash", "scripts/setup_env.sh"]
    result = subprocess.run(script, cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 2
    assert "MAXENT_GRPO_ENV=current but maxent-grpo is not on PATH" in result.stderr

    (tmp_path / "maxent-grpo").write_text("#!/bin/sh\n")
    (tmp_path / "maxent-grpo").chmod(0o755)
    env["PATH"] = f"{tmp_path}:/usr/bin:/bin"
    result = subprocess.run(script, cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(tmp_path)]


needs_kit = pytest.mark.skipif(
    os.environ.get("MAXENT_GRPO_GPU_KIT_TESTS") != "1",
    reason="the kit's CPU run: make test-gpu-kit (MAXENT_GRPO_GPU_KIT_TESTS=1)",
)
# The second kit run: only the signal step (and the model and warm-up), resume broken.
RESTART = {"GPU_KIT_STEPS": "signal", "MAXENT_GRPO_FAILPOINT": "resume_restart::skip"}


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory):
    """The kit on CPU and, side by side with it, its signal step with resume broken:
    name -> (exit code, output, JSON report, output folder)."""
    base = tmp_path_factory.mktemp("gpu-kit")
    procs = {}
    for name, extra in (("whole", {}), ("restart", RESTART)):
        procs[name] = subprocess.Popen(
            ["bash", "scripts/gpu_kit.sh", "run", "--cpu", str(base / name)],
            cwd=REPO,
            env={**os.environ, "GPU_KIT_PYTHON": sys.executable, **extra},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    found = {}
    for name, proc in procs.items():
        # The kit's CPU budget (600 s) bounds its steps; its report and cleanup come after.
        output = proc.communicate(timeout=720)[0]
        doc = json.loads((base / name / "gpu_kit.json").read_text())
        found[name] = (proc.returncode, output, doc, base / name)
    return found


def grpo_runs(steps: dict) -> dict[str, dict]:
    """Every GRPO training run in the kit's report that keeps its figures, by name."""
    signal = steps["signal"]["result"]
    runs = {"warmup": steps["warmup"]["result"]["run"]}
    runs |= {f"overhead-{i}": r for i, r in enumerate(steps["overhead"]["result"]["runs"], 1)}
    runs |= {"stopped": signal["stopped_run"], "resumed": signal["resumed_run"]}
    return runs | {"checkpointing": steps["checkpointing"]["result"]["on"]}


@pytest.mark.gpukit
@needs_kit
def test_the_kit_runs_every_step_on_cpu_and_reports_them(cpu_runs, tmp_path):
    code, output, doc, out = cpu_runs["whole"]
    print(output[-6000:])
    steps = doc["steps"]
    status = {name: step["status"] for name, step in steps.items()}
    assert status == {
        "install": "ok",
        "model": "ok",
        "warmup": "ok",
        "overhead": "ok",
        "signal": "ok",
        "oom": "skipped",
        "maxent": "ok",
        "checkpointing": "ok",
        "zero2": "skipped",
    }, {n: s["detail"] for n, s in steps.items()}
    assert code == 0
    assert doc["mode"] == "cpu" and doc["device"] == "CPU"

    # Every GRPO step learned: a non-zero grad_norm at each (the kit fails a run otherwise).
    for name, run in grpo_runs(steps).items():
        assert run["grad_norms"] and all(g and g > 0 for g in run["grad_norms"]), name
        assert len(run["grad_norms"]) == run["steps"], name
    signal = steps["signal"]["result"]

    # Ours against bare TRL: ABBA after the warm-up, at least 30 timed steps a side.
    overhead = steps["overhead"]["result"]
    assert overhead["order"] == ["bare", "module", "module", "bare"]
    assert [r["side"] for r in overhead["runs"]] == overhead["order"]
    assert overhead["same_completions"] is True
    for side in overhead["sides"].values():
        assert side["runs"] == 2 and side["timed_steps"] >= 30
        assert 0 < side["step_time_min_s"] <= side["step_time_s"]
    assert all(v > 0 for v in overhead["ratios"].values()), overhead["ratios"]
    assert len(overhead["round_ratios"]) == 2
    # Its time bound followed from the warm-up's cost, within the budget left at its start.
    again = kit_runs.Kit(tmp_path, "cpu")
    (tmp_path / "results" / "warmup.json").write_text(json.dumps(steps["warmup"]["result"]))
    left = re.search(r"=== step overhead \(at most \d+ s of (\d+) s left", output)
    assert left, output[-2000:]
    assert int(steps["overhead"]["cap_s"]) == min(kit.cap(again, "overhead"), int(left[1]))
    for name in ("maxent", "checkpointing"):
        assert all(v > 0 for v in steps[name]["result"]["ratios"].values()), name

    assert signal["stop"]["exit"] == 85 and signal["stop"]["checkpoint"].startswith("checkpoint-")
    assert signal["stop"]["signal_after_step"] >= 2
    at = int(signal["resumed_from"].rsplit("-", 1)[1])
    assert signal["resumed_steps"][0] == at + 1 and signal["resumed_steps"][-1] == 20
    assert signal["weights_equal"] is True and signal["max_abs_diff"] == 0.0
    assert signal["moved"] > 0

    assert steps["oom"]["detail"] == "skipped on CPU: needs CUDA (a real CUDA out-of-memory)"
    table = (out / "gpu_kit.md").read_text()
    assert "| oom | skipped | 0 | skipped on CPU: needs CUDA" in table
    assert "final weights equal to an uninterrupted run's: true" in table
    assert "| ours/bare | | |" in table and "## Where the time went" in table
    assert "| bare TRL, run 4 | 16 |" in table
    assert "== grpo-module-2.log" in (out / "gpu_kit_logs.txt").read_text()


@pytest.mark.gpukit
@needs_kit
def test_the_signal_step_fails_when_resume_restarts(cpu_runs):
    code, output, doc, _ = cpu_runs["restart"]
    print(output[-4000:])
    steps = doc["steps"]
    assert code == 1
    assert steps["model"]["status"] == steps["warmup"]["status"] == "ok"
    assert steps["overhead"]["status"] == "not run"
    assert steps["signal"]["status"] == "failed", steps["signal"]
    detail = steps["signal"]["detail"]
    assert "the resumed run restarted: its first step was 1, not " in detail, detail
    # The weights alone would have passed: a seeded restart replays the uninterrupted run.
    assert detail.endswith("final weights equal to the full run's: True")


def run(side: str, times: list[float], tokens: float = 100.0, memory: float = 900.0) -> dict:
    return {
        "side": side,
        "timed_step_times_s": times,
        "step_time_s": sorted(times)[len(times) // 2],
        "completion_tokens": tokens,
        "peak_gpu_mib": memory,
    }


def test_abba_pools_each_side_and_gives_each_rounds_ratio():
    order = ["bare", "module", "module", "bare"]
    runs = [
        run("bare", [1.0, 1.2, 1.1]),
        run("module", [1.1, 1.3, 1.2], memory=950.0),
        run("module", [0.9, 1.0, 1.4]),
        run("bare", [1.0, 0.8, 1.0]),
    ]
    found = kit_runs.abba(order, runs, "gpu")
    assert found["sides"]["bare"] == {
        "runs": 2,
        "timed_steps": 6,
        "step_time_s": 1.0,
        "step_time_min_s": 0.8,
        "completion_tokens_per_s": round(200 / 6.1, 1),
        "peak_gpu_mib": 900.0,
    }
    assert found["sides"]["module"]["step_time_s"] == 1.15
    assert found["ratios"]["step_time"] == 1.15 and found["ratios"]["step_time_min"] == 1.125
    assert found["ratios"]["peak_memory"] == round(950 / 900, 3)
    assert found["round_ratios"] == [round(1.2 / 1.1, 3), 1.0]
    # Before the first of ours has run, there is nothing to compare.
    assert "ratios" not in kit_runs.abba(order, runs[:1], "gpu")
    assert kit_runs.abba(order, runs[:2], "gpu")["round_ratios"] == [round(1.2 / 1.1, 3)]


def test_a_run_with_a_zero_or_missing_grad_norm_fails():
    learned = {"log_steps": [1, 2, 3], "grad_norms": [0.5, 1e-6, 2.0]}
    kit_runs.require_learning("grpo", learned)
    for norms, flat in (([0.5, 0.0, 2.0], "[2]"), ([None, 0.3, 0.0], "[1, 3]")):
        with pytest.raises(
            RuntimeError,
            match=rf"grpo: grad_norm zero or missing at step\(s\) {re.escape(flat)} of",
        ):
            kit_runs.require_learning("grpo", {"log_steps": [1, 2, 3], "grad_norms": norms})


def test_step_bounds_follow_the_work_at_the_warm_ups_cost(tmp_path):
    short = kit_runs.Kit(tmp_path / "a", "gpu", timed_steps=30)
    assert short.run_steps == 17  # 15 timed + the 2 left out, per run
    assert kit.cap(short, "overhead") == kit.NO_WARMUP_CAP  # nothing measured yet
    assert kit.cap(short, "model") == 120
    warm = {"ok": True, "fixed_s": 20.0, "step_s": 1.0}
    (tmp_path / "a" / "results" / "warmup.json").write_text(json.dumps(warm))
    assert kit.cap(short, "overhead") == 2 * 4 * (20 + 17) + 30
    long = kit_runs.Kit(tmp_path / "a", "gpu", timed_steps=60)
    assert kit.cap(long, "overhead") == 2 * 4 * (20 + 32) + 30
    # MaxEnt's GRPO side comes from the overhead step, or costs a run of its own.
    assert kit.cap(short, "maxent") == 2 * ((20 + 17) + (20 + 17 * 1.5)) + 30
    (tmp_path / "a" / "results" / "overhead.json").write_text(json.dumps({"sides": {"module": {}}}))
    assert kit.cap(short, "maxent") == 2 * (20 + 17 * 1.5) + 30
    # On CPU the kit runs as a test beside other work: a wider margin.
    on_cpu = kit_runs.Kit(tmp_path / "a", "cpu", timed_steps=30)
    assert kit.cap(on_cpu, "overhead") == 4 * 4 * (20 + on_cpu.run_steps) + 30


def test_the_gpu_models_tokenizer_decodes_every_id_and_encodes_as_the_tiny_one():
    from maxent_grpo.tiny_model import _build_tokenizer

    tiny, padded = _build_tokenizer(), kit_model.padded_tokenizer(1000)
    assert len(padded) == 1000 and len(tiny) < 400
    text = padded.apply_chat_template(
        [{"role": "user", "content": "What is 12 plus 7?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert padded(text)["input_ids"] == tiny(text)["input_ids"]
    # The ids the tiny tokenizer lacks decode to text, not to nothing.
    assert tiny.decode(list(range(400, 1000))) == ""
    assert len(padded.decode(list(range(400, 1000)))) > 300  # 2-3 bytes each


def fake_run(side: str, step: float) -> dict:
    found = run(side, [step] * 15, tokens=7500.0, memory=9000.0)
    found |= {"steps": 17, "step_time_min_s": step, "completion_tokens_per_s": 500.0}
    return found | {"wall_s": 30.0, "step_times_s": [1.2, 1.0], "grad_norms": [0.4, 0.2]}


def write_results(work: Path, results: dict, rcs: dict) -> None:
    steps = work / "steps"
    steps.mkdir(parents=True, exist_ok=True)
    for name, result in results.items():
        result = result if {"error", "partial"} & set(result) else {"ok": True, **result}
        (work / "results" / f"{name}.json").write_text(json.dumps(result))
        (steps / f"{name}.rc").write_text(f"{1 if 'error' in result else 0} 12.5 60\n")
    for name, line in rcs.items():
        (steps / f"{name}.rc").write_text(line + "\n")


def test_the_report_of_a_gpu_run_names_the_card_each_outcome_and_why_a_step_failed(tmp_path):
    # What the GPU steps write, made up: the CPU run never writes the oom and zero2 figures.
    work = kit_runs.Kit(tmp_path / "work", "gpu")
    order = ["bare", "module", "module", "bare"]
    runs = [fake_run(side, 1.0 if side == "bare" else 1.01) for side in order]
    ratios = {"step_time": 1.03, "step_time_min": 1.02}
    ratios |= {"completion_tokens_per_s": 0.99, "peak_memory": 1.14}
    oom = {"outcome": "oom", "attempts": 1, "exit": 2, "reason": "out of memory (...); lower x"}
    results = {
        "model": {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11", "cuda": "13.0"}
        | {"layers": 24, "hidden": 896, "vocab": 151936},
        "warmup": {"run": fake_run("module", 1.0), "fixed_s": 24.5, "step_s": 1.0},
        "overhead": {"runs": runs, **kit_runs.abba(order, runs, "gpu")},
        "oom": oom,
        "maxent": {"grpo": runs[1], "maxent": fake_run("module", 1.03), "ratios": ratios},
        "zero2": {"error": "RuntimeError: grpo-zero2 (training.sh) exited 1: ImportError: x"},
    }
    write_results(
        work.work,
        results,
        {
            "install": "0 3.0 120 wheels",
            "signal": "124 120.0 120",
            "checkpointing": "skipped 0 out of the kit's time budget (480 s)",
        },
    )
    (work.work / "conflicts.txt").write_text("datasets needs pyarrow>=24.0.0: 21.0.0 installed\n")

    assert report.write_report(work, tmp_path / "out", 400.0) == 1  # a step failed
    table = (tmp_path / "out" / "gpu_kit.md").read_text()
    assert table.startswith("# GPU proof kit: NVIDIA H100 80GB HBM3\n")
    assert "break: datasets needs pyarrow>=24.0.0: 21.0.0 installed." in table
    assert (
        "| oom | ok | 12 | outcome oom, 1 attempt, exit 2: out of memory (...); lower x |" in table
    )
    assert "| warmup | ok | 12 | untimed run of ours (17 steps): 24.5 s outside its steps" in table
    assert (
        "| overhead | ok | 12 | ours/bare over 30 timed steps a side (ABBA): median step 1.010x,"
        " minimum step 1.010x, tokens/s 0.990x, memory 1.000x; by round 1.010x, 1.010x |" in table
    )
    assert "| ours: python -m maxent_grpo.train | 2 | 30 | 1.01 | 1.01 | 495.0 | 9000.0 |" in table
    assert "| ours/bare | | | 1.010x | 1.010x | 0.990x | 1.000x |" in table
    assert "| signal | timed out | 120 | stopped at its bound of 120 s |" in table
    assert "| checkpointing | skipped | 0 | out of the kit's time budget (480 s) |" in table
    assert "| zero2 | failed | 12 | RuntimeError: grpo-zero2 (training.sh) exited 1" in table
    assert "| bare TRL, run 4 | 17 | 1.0 | 1.0 | 500.0 | 9000.0 | 0.2 | 30.0 |" in table
    assert "MaxEnt/GRPO: step time 1.030x (minimum 1.020x), memory 1.140x" in table
    saved = json.loads((tmp_path / "out" / "gpu_kit.json").read_text())
    assert saved["device"] == "NVIDIA H100 80GB HBM3" and saved["steps"]["zero2"]["exit"] == 1


def test_an_overhead_step_out_of_time_reports_the_runs_it_finished(tmp_path):
    work = kit_runs.Kit(tmp_path / "work", "gpu")
    order = ["bare", "module", "module", "bare"]
    runs = [fake_run("bare", 1.0), fake_run("module", 1.05)]
    model = {"device": "NVIDIA H200", "torch": "2.11", "cuda": "13.0"}
    model |= {"layers": 24, "hidden": 896, "vocab": 151936}
    partial = {"partial": True, "runs": runs, **kit_runs.abba(order, runs, "gpu")}
    write_results(work.work, {"model": model, "overhead": partial}, {"overhead": "124 300.0 300"})

    assert report.write_report(work, tmp_path / "out", 400.0) == 1
    table = (tmp_path / "out" / "gpu_kit.md").read_text()
    assert (
        "| overhead | timed out | 300 | stopped at its bound of 300 s; 2 of 4 runs done: ours/bare "
        "over 15 timed steps a side (ABBA): median step 1.050x" in table
    )
    assert "| bare TRL | 1 | 15 | 1.0 | 1.0 |" in table and "| bare TRL, run 1 |" in table
