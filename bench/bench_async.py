"""async_generation against TRL's synchronous loop, on one vLLM CPU server.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_async.py [--steps 16] [--rounds 1]

One server (the plan's command, started once) serves every run; 1 training process by
default (`--processes`). Each side gets one core of its own, as on GPUs each side has its own
device: the trainer runs on core 1 (taskset) and the whole server on core 0 (`--server-unpinned`
leaves it free). That holds since the plan runs a CPU server's model in its engine process
(vLLM's `uni` executor, launch/plan/server.py): with vLLM's default for its CPU build, the
model in a worker process, the engine waits for that worker spinning (sched_yield for 1 s
after each read, vllm/distributed/device_communicators/shm_broadcast.py), 0.23 CPU-s per 0.12
s request, nearly both cores: pinned to one core its spinning engine starved its worker (1.06
s steps), unpinned it took the trainer's core while the trainer trained, and async measured
1.05x (2026-11-27), the cores, not the pipeline. With `uni` a request takes 0.145 s and 0.145
CPU-s on its core. Each case runs the same
recipe, seed and number of completions both ways, alternated ABBA after an untimed warm-up
(vLLM's first generations). Per run: the median step time over the steps after the first three
(which pay the trainers' start and the pipeline's fill), the trainers' and the server's busy
shares on the median step (time/trainer_busy, time/server_busy), staleness, and the reward per
completion generated (the reward curve, from events.jsonl).

Cases:
- smoke: recipes/smoke/config_grpo_vllm.yaml as it is (32-token completions): generation is
  the longer side (the trainers wait 0.165 s of a 0.256 s synchronous step);
- balanced: 16-token completions, where the trainers' wait for generation (time/waiting_s) and
  their own share of the step (step - waiting) are about equal: the async step should approach
  the longer of the two, not their sum;
- short: 8-token completions, where the trainers' side is the longer one;
- oversample: `oversample_factor: 2` (rollout rounds, docs/rollouts.md): each step that
  generates asks for 4 groups, trains on 2 and carries 2, so every other step is filled by
  carried groups and generates nothing. Its steps alternate, so its figures use the mean step
  (an even number of steps), and the split by kind of step (generating, carried) says where
  the step waits;
- longtail (not run by default: `--cases longtail`): 100-token completions whose lengths are
  heavy-tailed (stop token ids cover a share of the vocabulary: about geometric), run four
  ways, ABBA: synchronous, one step ahead (k1), four (k4: `max_staleness: 4`) and four in
  25-token chunks (k4_partial: `partial_rollout_tokens: 25`). Its figures: steps per hour of
  each against k1 and sync, the completion tokens trained per second against the server's
  full-batch rate (32 completions of 100 tokens in one request, asked directly), the tokens
  the server generated (vLLM's /metrics counter) per CPU-second of its processes against the
  full batch's (how full its batch is when it works, whichever side waits), the case's
  length distribution (4 completions of each of 256 of the run's prompts, asked directly),
  the trainers' busy share, the
  staleness and the share of completions made under two policies. `--cases` picks cases.
`--replicas 2` serves from two engines behind one URL (`vllm_data_parallel_size`: each engine
its own process, vLLM's mp executor, unpinned): it shows async against replicas (staleness,
what is made ahead), not their speed, as two engines on two cores only share them.
The bound max(generation, training) / (generation + training) + 10 % is given two ways: with
the weight push (time/sync_s) on the trainers' side, where the synchronous step's split puts
it, and on the server's, which does its part (the reload) while the trainers wait for it and
cannot generate meanwhile. Wall time moves with other work on the machine: each run also gives
the CPU-seconds of the trainer (the training command and its children) and of the server's
processes during the run, which do not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import resource
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

LONG = 100  # the long tail's max_completion_length
CASES = {
    "smoke": {},
    "balanced": {"max_completion_length": 16},
    "short": {"max_completion_length": 8},
    "oversample": {"oversample_factor": 2.0},
    # Heavy-tailed lengths: 9 of the tiny model's 352 tokens end a completion, so lengths are
    # about geometric. On the run's own prompts (1,024 completions) 8 gave a median of 26 of
    # 100 and 8.4 % at 100, 9 gave 21-25 and 4.5-6.6 %: the shape (median at most a
    # quarter, at least 5 % at the limit) is a narrow band for a geometric length; the run's
    # figures say what these gave. A tenth of the recipe's learning rate keeps the shape
    # through a run: at 1e-3 the length reward had cut the last run's to a median of 16 and
    # 1.3 % at 100 (the step's work is the same at either rate).
    "longtail": {
        "max_completion_length": LONG,
        "generation_kwargs": {"stop_token_ids": list(range(100, 109))},
        "learning_rate": 1.0e-4,
    },
}
SIDES = {"sync": {"async_generation": False}, "async": {"async_generation": True}}
# The long tail's sides: synchronous, one step ahead, four, and four in chunks (a push waits
# for at most a quarter of the longest completion).
DEEP = {"async_generation": True, "max_staleness": 4}
CASE_SIDES = {
    "longtail": {
        "sync": SIDES["sync"],
        "k1": SIDES["async"],
        "k4": DEEP,
        "k4_partial": {**DEEP, "partial_rollout_tokens": LONG // 4},
    }
}
ALTERNATING = {"oversample"}  # steps that generate alternate with steps that do not
SERVER_CORES, TRAINER_CORES = "0", "1"  # one each, as on GPUs each side has its own device


def step_metrics(output_dir: Path) -> dict[int, dict]:
    found = {}
    for line in (output_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "step" and "loss" in event.get("metrics", {}):
            found[int(event["step"])] = event["metrics"]
    return found


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summary(steps: dict[int, dict], completions_per_step: int) -> dict:
    timed = [m for s, m in sorted(steps.items()) if s > 3]
    step_s = [m["time/step_s"] for m in timed]
    middle = sorted(timed, key=lambda m: m["time/step_s"])[len(timed) // 2]
    even = step_s[len(step_s) % 2 :]  # steps that alternate (oversample) in whole pairs
    generating = [m for m in timed if m.get("rollouts/rounds", 1) > 0]
    carried = [m for m in timed if m.get("rollouts/rounds", 1) == 0]
    return {
        "median_step_s": median(step_s),
        "mean_step_s": mean(even),
        "mean_sync_s": mean([m["time/sync_s"] for m in timed[len(timed) % 2 :]]),
        "median_sync_s": median([m["time/sync_s"] for m in timed]),
        "generating_step_s": median([m["time/step_s"] for m in generating]),
        "carried_step_s": median([m["time/step_s"] for m in carried]),
        "generating_wait_s": median([m["time/waiting_s"] for m in generating]),
        "async_wait_s": median([m["async/wait_s"] for m in generating if "async/wait_s" in m]),
        "min_step_s": min(step_s, default=None),
        "generation_s": median([m["time/generation_s"] for m in timed]),
        "training_s": median([m["time/training_s"] for m in timed]),
        "median_waiting_s": median([m["time/waiting_s"] for m in timed]),
        "median_trainer_side_s": median([m["time/step_s"] - m["time/waiting_s"] for m in timed]),
        "mean_waiting_s": mean([m["time/waiting_s"] for m in timed[len(timed) % 2 :]]),
        "mean_trainer_side_s": mean(
            [m["time/step_s"] - m["time/waiting_s"] for m in timed[len(timed) % 2 :]]
        ),
        "trainer_busy": middle.get("time/trainer_busy"),
        "server_busy": middle.get("time/server_busy"),
        "staleness_max": max((m.get("async/staleness_max", 0.0) for m in timed), default=0.0),
        "staleness": [m.get("async/staleness_max") for m in timed],
        "partial_share": mean(
            [m["async/partial_share"] for m in timed if "async/partial_share" in m]
        ),
        # completion tokens trained per second of the timed steps (the server made them)
        "tokens_per_s": sum(m["completions/mean_length"] for m in timed)
        * completions_per_step
        / max(sum(step_s), 1e-9),
        "mean_length": mean([m["completions/mean_length"] for m in timed]),
        "reward_per_completions": [
            (s * completions_per_step, m["reward"]) for s, m in sorted(steps.items())
        ],
    }


def run_once(workdir: Path, name: str, base: Path, plan_for, keys: dict, processes: int) -> dict:
    folder = workdir / name
    recipe = write_recipe(folder, base=base, **keys)
    command, env = plan_for(recipe)  # its host and port are the shared server's
    command = ["taskset", "-c", TRAINER_CORES, *command]
    server_before, trainer_before = server_cpu(), children_cpu()
    made_before = generated_tokens(plan_for.url)
    started = time.monotonic()
    result = subprocess.run(
        command, env=child_env(**env), capture_output=True, text=True, timeout=900
    )
    wall = time.monotonic() - started
    trainer_cpu, server_s = children_cpu() - trainer_before, server_cpu() - server_before
    made = generated_tokens(plan_for.url) - made_before
    if result.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    steps = step_metrics(folder / "out")
    per_step = keys["per_device_train_batch_size"] * processes
    return {
        "wall_s": wall,
        "trainer_cpu_s": trainer_cpu,
        "server_cpu_s": server_s,
        "server_tokens": made,
        "server_tokens_per_cpu_s": made / max(server_s, 1e-9),
        "load": list(os.getloadavg()),
        **summary(steps, per_step),
    }


def children_cpu() -> float:
    """CPU-seconds of this process's finished children (the training command's tree)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


SERVER_PIDS: list[int] = []  # the shared server's process, while it runs


def server_cpu() -> float:
    """CPU-seconds so far of the shared server's processes (its API server and engine)."""
    import psutil  # installed with vLLM's dependencies

    total = 0.0
    for pid in SERVER_PIDS:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    times = proc.cpu_times()
                    total += times.user + times.system
    return total


@contextlib.contextmanager
def shared_server(
    workdir: Path,
    processes: int,
    base_keys: dict,
    base: Path = SMOKE_VLLM,
    unpinned: bool = False,
):
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
    # Replicas: one engine each, which one core list cannot bind (vLLM asserts): left free.
    replicas = base_keys.get("vllm_data_parallel_size", 1)
    server_env = child_env(VLLM_CPU_OMP_THREADS_BIND=SERVER_CORES if replicas == 1 else "nobind")
    server_plan = plan.server
    if not unpinned:  # the whole server in its core, its HTTP process too
        command = ("taskset", "-c", SERVER_CORES, *server_plan.command)
        server_plan = dataclasses.replace(server_plan, command=command)
    server = VLLMServer(server_plan, workdir / "vllm.log", server_env).start()
    try:
        server.wait_until_healthy()
        SERVER_PIDS[:] = [server.pid]
        plan_for.url = f"http://{server_plan.host}:{server_plan.port}"  # type: ignore[attr-defined]
        plan_for.model = read_recipe(["--config", str(first)]).model_name_or_path  # type: ignore[attr-defined]
        yield plan_for
    finally:
        SERVER_PIDS.clear()
        server.stop()


def case_figures(case: str, runs: dict[str, list[dict]]) -> list[dict]:
    """One case's figures; an alternating case (oversample) by its mean step."""
    kind = "mean" if case in ALTERNATING else "median"

    def middle(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    sync, fast = middle("sync", f"{kind}_step_s"), middle("async", f"{kind}_step_s")
    # The two sides of the synchronous step: the trainers' wait for the server, and the rest.
    gen, train = middle("sync", f"{kind}_waiting_s"), middle("sync", f"{kind}_trainer_side_s")
    push = middle("sync", f"{kind}_sync_s")  # the weight push, inside the trainers' side
    busiest = max(runs["async"][0]["trainer_busy"] or 0, runs["async"][0]["server_busy"] or 0)
    cpu = {side: [middle(side, f"{part}_cpu_s") for part in ("trainer", "server")] for side in runs}
    waits = [r["async_wait_s"] for r in runs["async"] if r["async_wait_s"] is not None]
    return [
        figure(f"{case}: sync {kind} step", sync, "s"),
        figure(f"{case}: async {kind} step", fast, "s"),
        figure(
            f"{case}: steps per hour async / sync ({kind} step)",
            sync / fast,
            "x",
            is_ratio=True,
            note="CPU-s per run, trainer / server: sync {:.1f} / {:.1f}, "
            "async {:.1f} / {:.1f}".format(*cpu["sync"], *cpu["async"]),
        ),
        figure(
            f"{case}: step async / sync",
            fast / sync,
            "x",
            target=max(gen, train) / (gen + train) + 0.10,
            note=f"sync step: waiting for generation {gen:.3f} s, trainers' side {train:.3f} s",
        ),
        figure(
            f"{case}: step async / sync, the push on the server's side",
            fast / sync,
            "x",
            target=max(gen + push, train - push) / (gen + train) + 0.10,
            note=f"sync step: generation and push {gen + push:.3f} s, "
            f"trainers' side without it {train - push:.3f} s",
        ),
        figure(
            f"{case}: async generating step's wait for its completions (median)",
            statistics.median(waits) if waits else None,
            "s",
        ),
        figure(f"{case}: busier side's share on the median async step", busiest, "x"),
    ]


def run_prompts(model: str, count: int) -> list[list[int]]:
    """The token ids of the first `count` prompts the smoke recipe's trainers see: its data,
    made conversational by the trainers' own conversion (system prompt included), through the
    model's chat template."""
    import yaml
    from transformers import AutoTokenizer

    from maxent_grpo.data import builtin_dataset, to_conversation
    from maxent_grpo.recipe.script_keys import ScriptArguments

    recipe = yaml.safe_load(SMOKE_VLLM.read_text())
    seed = recipe.get("dataset_seed", ScriptArguments.dataset_seed)
    name = recipe["dataset_name"].removeprefix("builtin:")
    rows = builtin_dataset(name, num_rows=count, seed=seed)
    rows = to_conversation(rows, recipe["dataset_prompt_column"], None, recipe["system_prompt"])
    tokenizer = AutoTokenizer.from_pretrained(model)
    return [
        list(
            tokenizer.apply_chat_template(
                row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for row in rows
    ]


def completion_lengths(url: str, model: str, prompts: list[list[int]], n: int, **params):
    """The lengths of `n` completions of each prompt, asked of the server directly."""
    import requests

    from maxent_grpo.server_auth import auth_headers

    body = {"model": model, "prompt": prompts, "n": n, "max_tokens": LONG}
    body.update(return_token_ids=True, temperature=1.0, **params)
    answer = requests.post(f"{url}/v1/completions", json=body, headers=auth_headers(), timeout=300)
    answer.raise_for_status()
    return [len(choice["token_ids"]) for choice in answer.json()["choices"]]


def generated_tokens(url: str) -> float:
    """The tokens the server has generated so far (vLLM's counter on /metrics)."""
    import requests

    from maxent_grpo.server_auth import auth_headers

    answer = requests.get(f"{url}/metrics", headers=auth_headers(), timeout=30)
    answer.raise_for_status()
    counter = "vllm:generation_tokens_total"
    lines = [line for line in answer.text.splitlines() if line.startswith(counter)]
    if not lines:
        raise RuntimeError(f"{url}/metrics has no {counter}")
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def server_rates(url: str, model: str, sequences: int) -> dict:
    """The server's limit, asked directly: generated tokens per second and per CPU-second of
    its processes with `sequences` completions all `LONG` tokens long in one batch (its
    full-batch rate)."""
    full = dict(min_tokens=LONG, ignore_eos=True)
    completion_lengths(url, model, [[11, 12, 13, 14]], sequences, **full)  # warm
    rates, per_cpu = [], []
    for _ in range(3):
        started, cpu = time.monotonic(), server_cpu()
        made = sum(completion_lengths(url, model, [[11, 12, 13, 14]], sequences, **full))
        rates.append(made / (time.monotonic() - started))
        per_cpu.append(made / max(server_cpu() - cpu, 1e-9))
    return {
        "full_batch_tokens_per_s": statistics.median(rates),
        "full_batch_tokens_per_cpu_s": statistics.median(per_cpu),
    }


def case_stop_ids(case: str) -> list[int]:
    return CASES[case]["generation_kwargs"]["stop_token_ids"]


def length_shape(url: str, model: str, prompts: list[list[int]], stop_ids: list[int]) -> dict:
    """The case's completion lengths under the server's weights now: 4 completions of each of
    the run's `prompts` with its stop tokens (median, share reaching LONG). The run's prompts,
    not a made-up one: on a 4-token prompt 8 stop tokens gave a median of 19-21 and 2.3 % at
    LONG, on these 24-26 and 7-10 %."""
    lengths = completion_lengths(url, model, prompts, 4, stop_token_ids=stop_ids)
    return {
        "median_length": statistics.median(lengths),
        "share_at_max": sum(1 for n in lengths if n >= LONG) / len(lengths),
    }


def deep_figures(case: str, runs: dict[str, list[dict]], rates: dict) -> list[dict]:
    """The long tail's sides against each other, the server against its limit."""

    def middle(side: str, key: str) -> float:
        values = [r[key] for r in runs[side] if r[key] is not None]
        return statistics.median(values) if values else None

    step = {side: middle(side, "median_step_s") for side in runs}
    best = middle("k4_partial", "tokens_per_s")
    return [
        *[
            figure(
                f"{case}: completion lengths under {whose}, median of 1,024 (256 prompts x 4)",
                rates[key]["median_length"],
                "tokens",
                target=LONG / 4,
                note=f"share reaching {LONG}: {rates[key]['share_at_max']:.3f} (at least 0.05)",
            )
            for key, whose in (("shape_before", "the model"), ("shape_after", "the last run"))
        ],
        *[figure(f"{case}: {side} median step", step[side], "s") for side in runs],
        figure(
            f"{case}: steps per hour k4_partial / k1",
            step["k1"] / step["k4_partial"],
            "x",
            is_ratio=True,
            note="must show: at least 1.3x",
        ),
        figure(
            f"{case}: steps per hour k4_partial / sync",
            step["sync"] / step["k4_partial"],
            "x",
            is_ratio=True,
            note="must show: at least 1.8x",
        ),
        figure(f"{case}: steps per hour k4 / k1", step["k1"] / step["k4"], "x", is_ratio=True),
        figure(f"{case}: steps per hour k1 / sync", step["sync"] / step["k1"], "x", is_ratio=True),
        figure(
            f"{case}: server tokens/s k4_partial / its full-batch rate",
            best / rates["full_batch_tokens_per_s"],
            "x",
            is_ratio=True,
            note=f"full batch {rates['full_batch_tokens_per_s']:.0f} tokens/s; per side: "
            + ", ".join(f"{side} {middle(side, 'tokens_per_s'):.0f}" for side in runs),
        ),
        figure(
            f"{case}: server tokens per CPU-second, k4_partial / its full batch's",
            middle("k4_partial", "server_tokens_per_cpu_s") / rates["full_batch_tokens_per_cpu_s"],
            "x",
            is_ratio=True,
            note="how full its batch is when it works: the tokens it generated (vLLM's counter) "
            "over its processes' CPU-seconds, weight reloads included; full batch "
            f"{rates['full_batch_tokens_per_cpu_s']:.0f}; per side: "
            + ", ".join(f"{side} {middle(side, 'server_tokens_per_cpu_s'):.0f}" for side in runs),
        ),
        *[
            figure(
                f"{case}: {side} trainers' busy share (median step)",
                middle(side, "trainer_busy"),
                "x",
            )
            for side in runs
        ],
        *[
            figure(f"{case}: {side} staleness max", middle(side, "staleness_max"), "steps")
            for side in runs
            if side != "sync"
        ],
        figure(
            f"{case}: k4_partial share of completions made under two policies",
            middle("k4_partial", "partial_share"),
            "x",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1, help="ABBA rounds per case")
    parser.add_argument("--processes", type=int, default=1, help="training processes")
    parser.add_argument(
        "--cases", nargs="+", choices=list(CASES), default=[c for c in CASES if c != "longtail"]
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="vllm_data_parallel_size of the server (2: two engines behind one URL, unpinned)",
    )
    parser.add_argument(
        "--server-unpinned",
        action="store_true",
        help="leave the server's processes free to run on any core",
    )
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-async-"))
    # The smoke recipe's 8 completions a step (2 groups of 4), on any process count.
    per_device = 8 // args.processes
    base_keys = dict(
        max_steps=args.steps,
        save_strategy="no",
        num_processes=args.processes,
        per_device_train_batch_size=per_device,
    )
    if args.replicas > 1:  # one engine process each (vLLM's mp executor): not on one core
        base_keys["vllm_data_parallel_size"] = args.replicas
        args.server_unpinned = True
    results: dict[str, dict] = {}
    rates: dict[str, dict] = {}
    with shared_server(
        workdir, args.processes, base_keys, unpinned=args.server_unpinned
    ) as plan_for:
        prompts = run_prompts(plan_for.model, 256)
        before = {  # the shape the stop tokens give, before any run pushes weights
            case: length_shape(plan_for.url, plan_for.model, prompts, case_stop_ids(case))
            for case in args.cases
            if case in CASE_SIDES
        }
        warmup = {**base_keys, "max_steps": 4}
        run_once(workdir, "warmup", SMOKE_VLLM, plan_for, warmup, args.processes)
        for case in args.cases:
            extra = CASES[case]
            sides = CASE_SIDES.get(case, SIDES)
            runs: dict[str, list[dict]] = {side: [] for side in sides}
            order = ([*sides] + [*sides][::-1]) * args.rounds  # ABBA
            for i, side in enumerate(order):
                keys = {**base_keys, **extra, **sides[side]}
                runs[side].append(
                    run_once(
                        workdir, f"{case}-{side}-{i}", SMOKE_VLLM, plan_for, keys, args.processes
                    )
                )
                done = runs[side][-1]
                print(
                    f"{case} {side}: median {done['median_step_s']:.3f} s/step, mean "
                    f"{done['mean_step_s']:.3f}, CPU trainer {done['trainer_cpu_s']:.1f} s, "
                    f"server {done['server_cpu_s']:.1f} s, load {done['load'][0]:.1f}",
                    flush=True,
                )
            results[case] = runs
            if case in CASE_SIDES:
                per_step = base_keys["per_device_train_batch_size"] * args.processes
                rates[case] = {
                    **server_rates(plan_for.url, plan_for.model, 4 * per_step),
                    "shape_before": before[case],
                    "shape_after": length_shape(
                        plan_for.url, plan_for.model, prompts, case_stop_ids(case)
                    ),
                }
    figures = [
        f
        for case, runs in results.items()
        for f in (
            deep_figures(case, runs, rates[case])
            if case in CASE_SIDES
            else case_figures(case, runs)
        )
    ]
    print_figures(figures)
    settings = {"steps": args.steps, "processes": args.processes, "cases": args.cases}
    settings["server_unpinned"] = args.server_unpinned
    settings["replicas"] = args.replicas
    settings["server_rates"] = rates
    write_result("async", {"figures": figures, "runs": results, **settings}, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
