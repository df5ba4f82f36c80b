"""async_generation against TRL's synchronous loop, on one vLLM CPU server.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_async.py [--steps 16] [--rounds 1]

One server (the plan's command, started once) serves every run; 1 training process by default
(`--processes`). The server's compute threads are bound to core 0 (VLLM_CPU_OMP_THREADS_BIND;
by default vLLM's CPU engine binds every core) and the trainer to core 1 (taskset), as on GPUs
each side has its own device: otherwise the overlap is bounded by the cores, not the pipeline
(both sides would share both cores, and the step could not fall below their CPU seconds / 2,
whatever the pipeline does). Each
case runs the same recipe, seed and number of completions both ways, alternated ABBA after an
untimed warm-up (vLLM's first generations). Per run: the median step time over the steps after
the first three (which pay the trainers' start and the pipeline's fill), the trainers' and the
server's busy shares on the median step (time/trainer_busy, time/server_busy), staleness, and
the reward per completion generated (the reward curve, from events.jsonl).

Cases:
- smoke: recipes/smoke/config_grpo_vllm.yaml as it is (32-token completions): in the
  synchronous run the trainers' wait for generation (time/waiting_s) and their own share of
  the step (step - waiting) are about equal: the balanced case, where the async step should
  approach the longer of the two, not their sum;
- short: 8-token completions, where the trainers' side is the longer one.
On GPUs the server and the trainers have their own devices; here the figures show what the
pipeline does with one core each.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchlib import (
    PYTHON,
    SMOKE_VLLM,
    bench_parser,
    child_env,
    figure,
    median,
    print_figures,
    write_recipe,
    write_result,
)

CASES = {"smoke": {}, "short": {"max_completion_length": 8}}
SERVER_CORES, TRAINER_CORES = "0", "1"  # one each, as on GPUs each side has its own device


def step_metrics(output_dir: Path) -> dict[int, dict]:
    found = {}
    for line in (output_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "step" and "loss" in event.get("metrics", {}):
            found[int(event["step"])] = event["metrics"]
    return found


def summary(steps: dict[int, dict], completions_per_step: int) -> dict:
    timed = [m for s, m in sorted(steps.items()) if s > 3]
    step_s = [m["time/step_s"] for m in timed]
    middle = sorted(timed, key=lambda m: m["time/step_s"])[len(timed) // 2]
    return {
        "median_step_s": median(step_s),
        "min_step_s": min(step_s),
        "generation_s": median([m["time/generation_s"] for m in timed]),
        "training_s": median([m["time/training_s"] for m in timed]),
        "waiting_s": median([m["time/waiting_s"] for m in timed]),
        "trainer_side_s": median([m["time/step_s"] - m["time/waiting_s"] for m in timed]),
        "trainer_busy": middle.get("time/trainer_busy"),
        "server_busy": middle.get("time/server_busy"),
        "staleness_max": max((m.get("async/staleness_max", 0.0) for m in timed), default=0.0),
        "reward_per_completions": [
            (s * completions_per_step, m["reward"]) for s, m in sorted(steps.items())
        ],
    }


def run_once(workdir: Path, name: str, base: Path, plan_for, keys: dict, processes: int) -> dict:
    folder = workdir / name
    recipe = write_recipe(folder, base=base, **keys)
    command, env = plan_for(recipe)  # its host and port are the shared server's
    command = ["taskset", "-c", TRAINER_CORES, *command]
    started = time.monotonic()
    result = subprocess.run(
        command, env=child_env(**env), capture_output=True, text=True, timeout=900
    )
    if result.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    steps = step_metrics(folder / "out")
    per_step = keys["per_device_train_batch_size"] * processes
    return {"wall_s": time.monotonic() - started, **summary(steps, per_step)}


@contextlib.contextmanager
def shared_server(workdir: Path, processes: int, base_keys: dict, base: Path = SMOKE_VLLM):
    """One vLLM CPU server (the plan's command, its threads bound to SERVER_CORES) for every
    run; yields plan_for(recipe) -> (training command, env) aimed at that server."""
    from maxent_grpo.launch.plan import Environment, Ports, make_plan
    from maxent_grpo.launch.processes import free_port
    from maxent_grpo.launch.server import VLLMServer
    from maxent_grpo.recipe import read_recipe

    ports = Ports(vllm=free_port(), vllm_group=free_port(), main_process=free_port())
    environment = Environment(python=PYTHON, cpu_processes=processes)

    def plan_for(recipe: Path):
        plan = make_plan(environment, read_recipe(["--config", str(recipe)]), ports)
        return list(plan.train.command), dict(plan.train.env)

    first = write_recipe(workdir / "server", base=base, **base_keys)
    plan = make_plan(environment, read_recipe(["--config", str(first)]), ports)
    server_env = child_env(VLLM_CPU_OMP_THREADS_BIND=SERVER_CORES)
    server = VLLMServer(plan.server, workdir / "vllm.log", server_env).start()
    try:
        server.wait_until_healthy()
        yield plan_for
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1, help="ABBA rounds per case")
    parser.add_argument("--processes", type=int, default=1, help="training processes")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-async-"))
    # The smoke recipe's 8 completions a step (2 groups of 4), on any process count.
    per_device = 8 // args.processes
    base_keys = dict(
        max_steps=args.steps, save_strategy="no", per_device_train_batch_size=per_device
    )
    results: dict[str, dict] = {}
    with shared_server(workdir, args.processes, base_keys) as plan_for:
        warmup = {**base_keys, "max_steps": 4}
        run_once(workdir, "warmup", SMOKE_VLLM, plan_for, warmup, args.processes)
        for case, extra in CASES.items():
            runs: dict[str, list[dict]] = {"sync": [], "async": []}
            order = ["sync", "async", "async", "sync"] * args.rounds
            for i, side in enumerate(order):
                keys = {**base_keys, **extra, "async_generation": side == "async"}
                runs[side].append(
                    run_once(
                        workdir, f"{case}-{side}-{i}", SMOKE_VLLM, plan_for, keys, args.processes
                    )
                )
                print(f"{case} {side}: {runs[side][-1]['median_step_s']:.3f} s/step", flush=True)
            results[case] = runs
    figures = []
    for case, runs in results.items():
        sync = statistics.median(r["median_step_s"] for r in runs["sync"])
        fast = statistics.median(r["median_step_s"] for r in runs["async"])
        # The two sides of the synchronous step: the trainers' wait for the server, and the rest.
        gen = statistics.median(r["waiting_s"] for r in runs["sync"])
        train = statistics.median(r["trainer_side_s"] for r in runs["sync"])
        busiest = max(runs["async"][0]["trainer_busy"] or 0, runs["async"][0]["server_busy"] or 0)
        figures += [
            figure(f"{case}: sync median step", sync, "s"),
            figure(f"{case}: async median step", fast, "s"),
            figure(f"{case}: steps per hour async / sync", sync / fast, "x", is_ratio=True),
            figure(
                f"{case}: step async / sync",
                fast / sync,
                "x",
                target=max(gen, train) / (gen + train) + 0.10,
                note=f"sync step: waiting for generation {gen:.3f} s, trainers' side {train:.3f} s",
            ),
            figure(f"{case}: busier side's share on the median async step", busiest, "x"),
        ]
    print_figures(figures)
    settings = {"steps": args.steps, "processes": args.processes}
    write_result("async", {"figures": figures, "runs": results, **settings}, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
