"""The GPU proof kit (scripts/gpu_kit.sh): its package list, and its CPU run end to end.

The CPU run (marker gpukit, `make test-gpu-kit`, about 2.5 min) runs every step of the kit on
the tiny model and checks the table and the JSON, so the kit cannot rot between GPU loans.
It runs only with MAXENT_GRPO_GPU_KIT_TESTS=1 (the Makefile target sets it): `make test`
skips it. The package tests below are quick, offline, and in the default suite.
"""

from __future__ import annotations

import importlib.util
import json
import os
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


@pytest.mark.gpukit
@pytest.mark.skipif(
    os.environ.get("MAXENT_GRPO_GPU_KIT_TESTS") != "1",
    reason="the kit's CPU run: make test-gpu-kit (MAXENT_GRPO_GPU_KIT_TESTS=1)",
)
def test_the_kit_runs_every_step_on_cpu_and_reports_them(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        ["bash", "scripts/gpu_kit.sh", "run", "--cpu", str(out)],
        cwd=REPO,
        env={**os.environ, "GPU_KIT_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(result.stdout[-6000:], result.stderr[-3000:])
    report = json.loads((out / "gpu_kit.json").read_text())
    steps = report["steps"]
    status = {name: step["status"] for name, step in steps.items()}
    assert status == {
        "install": "ok",
        "model": "ok",
        "overhead": "ok",
        "signal": "ok",
        "oom": "skipped",
        "maxent": "ok",
        "checkpointing": "ok",
        "zero2": "skipped",
    }, {n: s["detail"] for n, s in steps.items()}
    assert result.returncode == 0
    assert report["mode"] == "cpu" and report["device"] == "CPU"

    overhead = steps["overhead"]["result"]
    assert set(overhead["runs"]) == {"bare", "module", "training.sh"}
    for side in ("module", "training.sh"):
        assert all(v > 0 for v in overhead["ratios"][side].values()), overhead["ratios"]
    for name in ("maxent", "checkpointing"):
        assert all(v > 0 for v in steps[name]["result"]["ratios"].values()), name

    signal = steps["signal"]["result"]
    assert signal["stop"]["exit"] == 85 and signal["stop"]["checkpoint"].startswith("checkpoint-")
    assert signal["stop"]["signal_after_step"] >= 2
    assert signal["weights_equal"] is True and signal["max_abs_diff"] == 0.0

    assert steps["oom"]["detail"] == "skipped on CPU: needs CUDA (a real CUDA out-of-memory)"
    table = (out / "gpu_kit.md").read_text()
    assert "| oom | skipped | 0 | skipped on CPU: needs CUDA" in table
    assert "final weights equal to an uninterrupted run's: true" in table
    assert "| ours: bash training.sh |" in table and "## Where the time went" in table
    assert "== grpo-training.sh.log" in (out / "gpu_kit_logs.txt").read_text()


def test_the_report_of_a_gpu_run_names_the_card_each_outcome_and_why_a_step_failed(tmp_path):
    # What the GPU steps write, made up: the CPU run never writes the oom and zero2 figures.
    sys.path.insert(0, str(REPO / "bench" / "gpu_kit"))
    try:
        import kit
        import report
    finally:
        sys.path.pop(0)
    work = kit.Kit(tmp_path / "work", "gpu")
    run = {"step_time_s": 1.0, "completion_tokens_per_s": 500.0, "peak_gpu_mib": 9000.0}
    run.update(wall_s=30.0, step_times_s=[1.2, 1.0])
    ratios = {"step_time": 1.01, "completion_tokens_per_s": 0.99, "peak_memory": 1.0}
    oom = {"outcome": "oom", "attempts": 1, "exit": 2, "reason": "out of memory (...); lower x"}
    results = {
        "model": {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11", "cuda": "13.0"}
        | {"layers": 24, "hidden": 896, "vocab": 151936},
        "overhead": {"runs": {"bare": run, "module": run, "training.sh": run}}
        | {"ratios": {"module": ratios, "training.sh": ratios}},
        "oom": oom,
        "maxent": {"grpo": run, "maxent": run, "ratios": ratios},
        "zero2": {"error": "RuntimeError: grpo-zero2 (training.sh) exited 1: ImportError: x"},
    }
    steps = work.work / "steps"
    steps.mkdir(parents=True)
    for name, result in results.items():
        result = result if "error" in result else {"ok": True, **result}
        (work.work / "results" / f"{name}.json").write_text(json.dumps(result))
        (steps / f"{name}.rc").write_text(f"{1 if 'error' in result else 0} 12.5 60\n")
    (steps / "install.rc").write_text("0 3.0 120 wheels\n")
    (work.work / "conflicts.txt").write_text("datasets needs pyarrow>=24.0.0: 21.0.0 installed\n")
    (steps / "signal.rc").write_text("124 120.0 120\n")
    (steps / "checkpointing.rc").write_text("skipped 0 out of the kit's time budget (390 s)\n")

    assert report.write_report(work, tmp_path / "out", 400.0) == 1  # a step failed
    table = (tmp_path / "out" / "gpu_kit.md").read_text()
    assert table.startswith("# GPU proof kit: NVIDIA H100 80GB HBM3\n")
    assert "break: datasets needs pyarrow>=24.0.0: 21.0.0 installed." in table
    assert (
        "| oom | ok | 12 | outcome oom, 1 attempt, exit 2: out of memory (...); lower x |" in table
    )
    assert "| signal | timed out | 120 | stopped at its bound of 120 s |" in table
    assert "| checkpointing | skipped | 0 | out of the kit's time budget (390 s) |" in table
    assert "| zero2 | failed | 12 | RuntimeError: grpo-zero2 (training.sh) exited 1" in table
    assert "| ours: bash training.sh | 1.0 | 500.0 | 9000.0 | 30.0 |" in table
    assert "MaxEnt/GRPO: step time 1.010x, memory 1.000x" in table
    saved = json.loads((tmp_path / "out" / "gpu_kit.json").read_text())
    assert saved["device"] == "NVIDIA H100 80GB HBM3" and saved["steps"]["zero2"]["exit"] == 1
