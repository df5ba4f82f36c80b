"""Launcher overhead: `bash training.sh` to the first training step, and what of it is ours.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_launcher.py [--repeats 3] [--no-vllm]

1. Time to the first step, A/B: `bash training.sh` (smoke recipe, 2 steps, 2 CPU processes)
   against the training command the launcher plans (maxent_grpo.launch.plan.make_plan) with
   only its entry script swapped for bench/bare_trl_grpo.py, same recipe, alternating ABBA over
   --repeats rounds. Each output line is stamped on arrival;
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
   (recipes/smoke/config_grpo_vllm.yaml, --vllm-steps steps) through training.sh: launch to
   the first step with the server and the trainers started together (overlapped) and one after
   the other (serial), the launcher's "healthy after Xs" and the per-step
   `vllm/weight_sync_seconds` (bench/bench_vllm.py). Otherwise prints 'skipped: vllm not
   installed'.
Writes bench/results/launcher.json.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_vllm import vllm_figures, vllm_run
from benchlib import (
    BARE_SCRIPT,
    PYTHON,
    REPO,
    SMOKE,
    Measurement,
    bench_parser,
    child_env,
    figure,
    loadavg,
    median,
    planned_training,
    print_figures,
    run_timestamped,
    write_recipe,
)

TARGET_OWN_S = 2.0
STEP_LINE = "'loss'"
STEP_TIME_RE = re.compile(r"'step_time': '([0-9.e+-]+)'")
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
    """The launcher's planned training command, its entry script swapped for the bare one."""
    out = workdir / f"out-{tag}"
    planned = planned_training(recipe, overrides=["--output_dir", str(out)])
    run = run_timestamped(planned.with_entry(str(BARE_SCRIPT)), env=child_env(**planned.env))
    shutil.rmtree(out, ignore_errors=True)
    return run


SIDES = {"ours": (run_ours, "bash training.sh"), "bare": (run_bare, "bare accelerate launch")}


def timed_side(side: str, recipe: Path, workdir: Path, tag: str) -> dict:
    """One run of one side: when its step 1, data and model arrived."""
    start, what = SIDES[side]
    run = start(recipe, workdir, tag)
    t_first, step1 = first_step(run, what)
    result = {"first_step_s": t_first, "step1_step_time_s": step1}
    if side == "ours":
        result["plan_printed_s"] = run.first("device: ")
    result["trainer_data_s"] = run.first("Map")
    result["model_loaded_s"] = run.first("Loading weights")
    result["wall_s"] = run.wall_s
    return result


def startup_ab(recipe: Path, workdir: Path, repeats: int) -> dict:
    rounds = []
    for round_ in range(repeats):
        order = ("ours", "bare") if round_ % 2 == 0 else ("bare", "ours")
        result = {}
        for side in order:
            result[side] = timed_side(side, recipe, workdir, f"{side}-{round_}")
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


def json_probe(cmd: list[str], what: str, tail: int) -> dict:
    """Run a probe in a fresh interpreter; its last output line is a JSON object."""
    proc = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{what} failed:\n{proc.stderr[-tail:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def import_and_load(repeats: int) -> dict:
    cmd = [PYTHON, "-c", IMPORT_AND_LOAD, TINY_MODEL]
    samples = [json_probe(cmd, "import/model-load probe", 2000) for _ in range(repeats)]
    return {key: median([s[key] for s in samples]) for key in samples[0]} | {"samples": samples}


def timed_command(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def phases(recipe: Path, workdir: Path) -> dict:
    cmd = [PYTHON, str(REPO / "bench" / "launcher_phases.py"), str(recipe), str(workdir / "logs")]
    result = json_probe(cmd, "launcher_phases.py", 3000)
    result["setup_env_s"] = timed_command(["bash", "scripts/setup_env.sh"], 3)
    result["python_start_s"] = timed_command([PYTHON, "-c", "pass"], 3)
    return result


def measure(args) -> dict:
    """The A/B start-up runs, the probes, the launcher's phases and the vLLM run."""
    with tempfile.TemporaryDirectory(prefix="bench-launcher-") as tmp:
        workdir = Path(tmp)
        recipe = write_recipe(
            workdir,
            SMOKE,
            "recipe.yaml",
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
    return {"startup_ab": ab, "import_and_load": probe, "phases": parts, "vllm": vllm}


def launcher_figures(ab: dict, probe: dict, parts: dict) -> list[dict]:
    residual = ab["ours_first_step_s"] - probe["import_s"] - probe["model_load_s"]
    residual -= ab["ours_step1_s"]
    launcher_own = parts["setup_env_s"] + parts["python_start_s"]
    launcher_own += parts["launcher_in_process_s"]
    trainer_extra = parts["trainer_parse_and_check_s"] - parts["bare_config_s"]
    rounds = ", ".join(f"{r['own_s']:.2f}" for r in ab["rounds"])
    return [
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


def print_phases(parts: dict) -> None:
    print("  our own part, phase by phase (launcher_phases.py, fresh interpreter):")
    print(f"    bash scripts/setup_env.sh (fast path): {parts['setup_env_s']:.3f} s")
    print(f"    python interpreter start: {parts['python_start_s']:.3f} s")
    for name, seconds in parts["phases_s"].items():
        print(f"    {name}: {seconds:.3f} s")
    heavy = parts.get("launcher_heavy_modules", [])
    print(f"    torch/TRL/transformers/datasets/peft imported by the launcher: {heavy or 'none'}")
    print(
        f"    trainers: parse_and_check {parts['trainer_parse_and_check_s']:.3f} s vs bare "
        f"GRPOConfig {parts['bare_config_s']:.3f} s (imports already paid)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="A/B rounds (ours, bare)")
    parser.add_argument("--vllm-steps", type=int, default=4, help="steps of the vLLM run")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM server run")
    args = parser.parse_args(argv)

    from maxent_grpo.tiny_model import DEFAULT_TINY_MODEL_DIR, ensure_tiny_model

    measurement = Measurement("launcher", args.output)
    ensure_tiny_model(REPO / DEFAULT_TINY_MODEL_DIR)  # built once, outside the timings
    results = measure(args)
    ab, probe, parts = results["startup_ab"], results["import_and_load"], results["phases"]
    figures = launcher_figures(ab, probe, parts) + vllm_figures(results["vllm"])
    print_figures(figures)
    print_phases(parts)
    settings = {"repeats": args.repeats, "vllm_steps": args.vllm_steps}
    measurement.finish(figures, settings, **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
