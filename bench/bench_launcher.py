"""Launcher overhead: `bash training.sh` to the first training step, and what of it is ours.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_launcher.py [--repeats 3] [--no-vllm]

1. Time to the first step, A/B: `bash training.sh` (smoke recipe, 2 steps, 2 CPU processes)
   against a bare `accelerate launch bench/bare_trl_grpo.py` with the launcher's flags and the
   same recipe, alternating ABBA over --repeats rounds. Each output line is stamped on arrival;
   "first step" is the arrival of step 1's metrics line. Our own overhead = median over rounds
   of (ours - bare): setup_env check, the launcher's interpreter, imports and recipe
   parse/preflight, the plan, the process start, and the trainers' second parse/check.
   Target: <= 2 s.
2. The brief's decomposition: time to first step minus the import time
   (`import trl, transformers, maxent_grpo.train` plus `from trl import GRPOConfig,
   GRPOTrainer`, since TRL imports lazily) and minus a bare model + tokenizer load, both
   measured in fresh interpreters, and minus step 1's own step_time.
3. Our part, phase by phase: bench/launcher_phases.py in a fresh interpreter, plus
   `bash scripts/setup_env.sh` (the fast path training.sh takes) and interpreter start.
4. vLLM (only when the venv has vllm, found as the launcher looks for it): the CPU server recipe
   (recipes/smoke/config_grpo_vllm.yaml, --vllm-steps steps) through training.sh: the
   launcher's "healthy after Xs", the per-step `vllm/weight_sync_seconds` from
   trainer_state.json, and how long the trainers take to start after the server is healthy
   (serial today). Otherwise prints 'skipped: vllm not installed'.
Writes bench/results/launcher.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from benchlib import (
    BARE_SCRIPT,
    PYTHON,
    ROOT,
    SMOKE_GRPO,
    SMOKE_VLLM,
    accelerate_cpu_launch,
    child_env,
    figure,
    free_port,
    loadavg,
    machine,
    median,
    print_figures,
    run_timestamped,
    write_result,
)

TARGET_OWN_S = 2.0
STEP_LINE = "'loss'"
STEP_TIME_RE = re.compile(r"'step_time': '([0-9.e+-]+)'")
HEALTHY_RE = re.compile(r"vLLM server healthy after ([0-9.]+)s")
STOPPED_RE = re.compile(r"vLLM server stopped in ([0-9.]+)s")
TINY_MODEL = ".cache/models/tiny-qwen2"  # the launcher's default: it checks and reuses it

IMPORT_AND_LOAD = """
import json, sys, time
t0 = time.perf_counter()
import trl, transformers, maxent_grpo.train.entry
t1 = time.perf_counter()
from trl import GRPOConfig, GRPOTrainer
t2 = time.perf_counter()
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype="float32")
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
t3 = time.perf_counter()
print(json.dumps({"lazy_import_s": t1 - t0, "import_s": t2 - t0, "model_load_s": t3 - t2}))
"""


def write_recipe(base: Path, path: Path, **overrides) -> Path:
    recipe = yaml.safe_load(base.read_text())
    recipe.update(overrides)
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def first_step(run, what: str) -> tuple[float, float]:
    """(arrival of step 1's metrics line, its step_time)."""
    if run.returncode != 0:
        sys.exit(f"{what} failed with {run.returncode}:\n{run.tail()}")
    for t, line in run.lines:
        if STEP_LINE in line:
            match = STEP_TIME_RE.search(line)
            return t, float(match.group(1)) if match else 0.0
    sys.exit(f"{what}: no step line in its output:\n{run.tail()}")


def run_ours(recipe: Path, workdir: Path, tag: str):
    out = workdir / f"out-{tag}"
    cmd = ["bash", "training.sh", "--logs-dir", str(workdir / "logs"), "--"]
    cmd += ["--output_dir", str(out)]
    env = child_env(RECIPE=str(recipe))
    env.pop("CUDA_VISIBLE_DEVICES")  # as a user runs it; the smoke recipe says use_cpu
    run = run_timestamped(cmd, env=env)
    shutil.rmtree(out, ignore_errors=True)
    return run


def run_bare(recipe: Path, workdir: Path, tag: str):
    out = workdir / f"out-{tag}"
    cmd = [*accelerate_cpu_launch(2, free_port()), str(BARE_SCRIPT), "--config", str(recipe)]
    cmd += ["--output_dir", str(out)]
    run = run_timestamped(cmd, env=child_env())
    shutil.rmtree(out, ignore_errors=True)
    return run


def startup_ab(recipe: Path, workdir: Path, repeats: int) -> dict:
    rounds = []
    for round_ in range(repeats):
        order = ("ours", "bare") if round_ % 2 == 0 else ("bare", "ours")
        result = {}
        for side in order:
            tag = f"{side}-{round_}"
            if side == "ours":
                run = run_ours(recipe, workdir, tag)
                t_first, step1 = first_step(run, "bash training.sh")
                result["ours"] = {
                    "first_step_s": t_first,
                    "step1_step_time_s": step1,
                    "plan_printed_s": run.first("device: "),
                    "trainer_data_s": run.first("Map"),
                    "model_loaded_s": run.first("Loading weights"),
                    "wall_s": run.wall_s,
                }
            else:
                run = run_bare(recipe, workdir, tag)
                t_first, step1 = first_step(run, "bare accelerate launch")
                result["bare"] = {
                    "first_step_s": t_first,
                    "step1_step_time_s": step1,
                    "trainer_data_s": run.first("Map"),
                    "model_loaded_s": run.first("Loading weights"),
                    "wall_s": run.wall_s,
                }
            print(
                f"  round {round_ + 1}/{repeats} {side}: first step after "
                f"{result[side]['first_step_s']:.2f} s (load {loadavg()[0]})",
                flush=True,
            )
        result["own_s"] = result["ours"]["first_step_s"] - result["bare"]["first_step_s"]
        rounds.append(result)
    return {
        "rounds": rounds,
        "ours_first_step_s": median([r["ours"]["first_step_s"] for r in rounds]),
        "bare_first_step_s": median([r["bare"]["first_step_s"] for r in rounds]),
        "own_s": median([r["own_s"] for r in rounds]),
        "ours_plan_printed_s": median([r["ours"]["plan_printed_s"] or 0.0 for r in rounds]),
        "ours_step1_s": median([r["ours"]["step1_step_time_s"] for r in rounds]),
    }


def import_and_load(repeats: int) -> dict:
    samples = []
    for _ in range(repeats):
        proc = subprocess.run(
            [PYTHON, "-c", IMPORT_AND_LOAD, TINY_MODEL],
            cwd=ROOT,
            env=child_env(),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            sys.exit(f"import/model-load probe failed:\n{proc.stderr[-2000:]}")
        samples.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {key: median([s[key] for s in samples]) for key in samples[0]} | {"samples": samples}


def timed_command(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def phases(recipe: Path, workdir: Path) -> dict:
    proc = subprocess.run(
        [PYTHON, str(ROOT / "bench" / "launcher_phases.py"), str(recipe), str(workdir / "logs")],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.exit(f"launcher_phases.py failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["setup_env_s"] = timed_command(["bash", "scripts/setup_env.sh"], 3)
    result["python_start_s"] = timed_command([PYTHON, "-c", "pass"], 3)
    return result


def vllm_run(workdir: Path, steps: int) -> dict:
    if importlib.util.find_spec("vllm") is None:
        print("vLLM: skipped: vllm not installed", flush=True)
        return {"skipped": "vllm not installed"}
    out = workdir / "out-vllm"
    recipe = write_recipe(
        SMOKE_VLLM,
        workdir / "vllm.yaml",
        model_name_or_path=TINY_MODEL,
        output_dir=str(out),
        max_steps=steps,
        save_steps=10_000,
    )
    cmd = ["bash", "training.sh", "--logs-dir", str(workdir / "logs")]
    env = child_env(RECIPE=str(recipe))
    env.pop("CUDA_VISIBLE_DEVICES")
    print(f"vLLM: CPU server recipe, {steps} steps (server start takes a while on CPU)", flush=True)
    run = run_timestamped(cmd, env=env, timeout=900)
    if run.returncode != 0:
        print(f"vLLM run failed ({run.returncode}):\n{run.tail(30)}", flush=True)
        return {"failed": run.returncode, "tail": run.tail(30)}
    text = run.text()
    healthy = HEALTHY_RE.search(text)
    stopped = STOPPED_RE.search(text)
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    syncs = [e["vllm/weight_sync_seconds"] for e in history if "vllm/weight_sync_seconds" in e]
    step_times = [e["step_time"] for e in history if "step_time" in e]
    t_healthy = run.first("vLLM server healthy")
    t_first, step1 = first_step(run, "vLLM run")
    shutil.rmtree(out, ignore_errors=True)
    steady_syncs = syncs[1:] or syncs
    return {
        "healthy_after_s": float(healthy.group(1)) if healthy else None,
        "server_stop_s": float(stopped.group(1)) if stopped else None,
        "weight_sync_s": syncs,
        "weight_sync_median_s": median(steady_syncs),
        "step_time_s": step_times,
        "step_time_median_s": median(step_times[1:] or step_times),
        "trainer_start_after_healthy_s": (t_first - t_healthy - step1) if t_healthy else None,
        "first_step_s": t_first,
        "wall_s": run.wall_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="A/B rounds (ours, bare)")
    parser.add_argument("--vllm-steps", type=int, default=4, help="steps of the vLLM run")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM server run")
    parser.add_argument("--output", type=Path, default=None, help="JSON results file")
    args = parser.parse_args(argv)

    from maxent_grpo.tiny_model import DEFAULT_TINY_MODEL_DIR, ensure_tiny_model

    load_before = loadavg()
    started = time.monotonic()
    ensure_tiny_model(ROOT / DEFAULT_TINY_MODEL_DIR)  # built once, outside the timings
    figures = []
    with tempfile.TemporaryDirectory(prefix="bench-launcher-") as tmp:
        workdir = Path(tmp)
        recipe = write_recipe(
            SMOKE_GRPO,
            workdir / "recipe.yaml",
            model_name_or_path=TINY_MODEL,
            max_steps=2,
            save_steps=10_000,
            output_dir=str(workdir / "out"),
        )
        print("launcher: bash training.sh vs bare accelerate launch, to the first step", flush=True)
        ab = startup_ab(recipe, workdir, args.repeats)
        print("launcher: import and model-load probes, launcher phases", flush=True)
        probe = import_and_load(min(2, args.repeats))
        parts = phases(recipe, workdir)
        vllm = {"skipped": "--no-vllm"} if args.no_vllm else vllm_run(workdir, args.vllm_steps)

    residual = ab["ours_first_step_s"] - probe["import_s"] - probe["model_load_s"]
    residual -= ab["ours_step1_s"]
    launcher_own = parts["setup_env_s"] + parts["python_start_s"]
    launcher_own += parts["launcher_in_process_s"]
    trainer_extra = parts["trainer_parse_and_check_s"] - parts["bare_config_s"]
    rounds = ", ".join(f"{r['own_s']:.2f}" for r in ab["rounds"])
    figures += [
        figure(
            "launcher: time to first step, bash training.sh",
            ab["ours_first_step_s"],
            "s",
            note=f"plan printed at {ab['ours_plan_printed_s']:.2f} s",
        ),
        figure(
            "launcher: time to first step, bare accelerate launch", ab["bare_first_step_s"], "s"
        ),
        figure(
            "launcher: our own overhead (ours - bare, A/B)",
            ab["own_s"],
            "s",
            TARGET_OWN_S,
            note=f"per round {rounds}",
        ),
        figure(
            "launcher: our own part, sum of measured phases",
            launcher_own + trainer_extra,
            "s",
            TARGET_OWN_S,
            note=f"setup_env {parts['setup_env_s']:.2f} s + interpreter "
            f"{parts['python_start_s']:.2f} s + launcher imports/parse/preflight/plan/Popen "
            f"{parts['launcher_in_process_s']:.2f} s + trainer re-check {trainer_extra:.3f} s",
        ),
        figure(
            "launcher: first step - imports - model load - step 1 (brief's formula)",
            residual,
            "s",
            note=f"imports {probe['import_s']:.2f} s (lazy 'import trl, transformers, "
            f"maxent_grpo.train' alone {probe['lazy_import_s']:.2f} s), model+tokenizer "
            f"{probe['model_load_s']:.2f} s, step 1 {ab['ours_step1_s']:.2f} s; the rest "
            "includes accelerate's own start and TRL's trainer init, which bare pays too",
        ),
    ]
    if "healthy_after_s" in vllm:
        figures += [
            figure("vllm: server healthy after", vllm["healthy_after_s"], "s"),
            figure(
                "vllm: disk weight sync per step (median)",
                vllm["weight_sync_median_s"],
                "s",
                note=f"step_time median {vllm['step_time_median_s']:.3f} s; all syncs "
                + ", ".join(f"{s:.3f}" for s in vllm["weight_sync_s"]),
            ),
            figure(
                "vllm: weight sync / step time",
                vllm["weight_sync_median_s"] / vllm["step_time_median_s"],
                "x",
                is_ratio=True,
            ),
            figure(
                "vllm: trainer start after server healthy (serial)",
                vllm["trainer_start_after_healthy_s"],
                "s",
                note="could overlap the server start",
            ),
        ]
    else:
        figures.append(
            figure("vllm: server healthy after", None, "s", note=vllm.get("skipped", "failed"))
        )
    print_figures(figures)
    print("  our own part, phase by phase (launcher_phases.py, fresh interpreter):")
    print(f"    bash scripts/setup_env.sh (fast path): {parts['setup_env_s']:.3f} s")
    print(f"    python interpreter start: {parts['python_start_s']:.3f} s")
    for name, seconds in parts["phases_s"].items():
        print(f"    {name}: {seconds:.3f} s")
    print(
        f"    trainers: parse_and_check {parts['trainer_parse_and_check_s']:.3f} s vs bare "
        f"GRPOConfig {parts['bare_config_s']:.3f} s (imports already paid)",
        flush=True,
    )
    write_result(
        "launcher",
        {
            "figures": figures,
            "startup_ab": ab,
            "import_and_load": probe,
            "phases": parts,
            "vllm": vllm,
            "load_average": {"before": load_before, "after": loadavg()},
            "settings": {"repeats": args.repeats, "vllm_steps": args.vllm_steps},
            "machine": machine(),
            "wall_s": time.monotonic() - started,
        },
        args.output,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
