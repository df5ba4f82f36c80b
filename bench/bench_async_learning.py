"""Does learning hold with async_generation? Sync against async, 3 seeds, reward per completion.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_async_learning.py [--steps 120] [--seeds 3]

The CPU vLLM smoke recipe (recipes/smoke/config_grpo_vllm.yaml) on one vLLM CPU server shared
by every run (bench_async.shared_server: server on core 0, the trainer on core 1), with the
keys that make the tiny random model's reward rise within a few minutes (LEARNING below; see
docs/performance.md for how they were chosen). Each seed runs both sides, the order alternated
(sync, async for seed 0; async, sync for seed 1; ...). Every run starts from the same weights:
the trainer pushes its own to the server before its first generation.

Per run: the reward curve against the completions trained on (step x completions a step; an
async run has generated one step more by then), the first and final windows' mean reward
(`--window` steps each). Across seeds, per side: the mean of the final windows and their spread
(max - min). The verdict needs the reward to have risen (sync's final window above its first by
more than the seeds' spread); it holds when the async mean is at most the sync seeds' spread
below the sync mean.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import yaml
from bench_async import CASE_SIDES, SIDES, run_once, shared_server
from benchlib import SMOKE_VLLM, Measurement, bench_parser, figure, print_figures

# A reward the random tiny model's completions spread in (a third of its tokens are single
# non-ASCII bytes) and that it can climb (0.73 -> 0.99 in 120 steps). The smoke recipe's own
# mix (--smoke-rewards) rises only by collapse: answer_match, format and tag_count stay 0 and
# `length` (at most 0 for a wrong answer) drives the completions from 31 tokens to 1
# (-0.08 -> -0.01, ceiling 0): no room to tell two runs apart. At 3e-3, ascii_fraction is 1.0
# for every completion from step 50 on, and the final window's spread is 0.
SPREAD = "target: the sync seeds' spread"
# The sides a run can take (bench_async.py's long-tail sides, by the same names).
SIDE_KEYS = {"sync": SIDES["sync"], "async": SIDES["async"], **CASE_SIDES["longtail"]}
LEARNING = dict(reward_funcs=["ascii_fraction"], reward_weights=[1.0], learning_rate=1.0e-3)


def window_mean(curve: list[tuple[int, float]], first: bool, steps: int) -> float:
    part = curve[:steps] if first else curve[-steps:]
    return statistics.fmean(reward for _, reward in part)


def learning_run(workdir: Path, name: str, plan_for, keys: dict, window: int) -> dict:
    run = run_once(workdir, name, SMOKE_VLLM, plan_for, keys, processes=1)
    curve = run["reward_per_completions"]
    return {
        "seed": keys["seed"],
        "wall_s": run["wall_s"],
        "median_step_s": run["median_step_s"],
        "staleness_max": run["staleness_max"],
        "first": window_mean(curve, True, window),
        "final": window_mean(curve, False, window),
        "run_mean": window_mean(curve, True, len(curve)),
        "curve": curve,
    }


def binned(runs: list[dict], width: int) -> list[tuple[int, float]]:
    """The seeds' mean reward per `width` steps: (completions at the bin's end, mean)."""
    n = min(len(r["curve"]) for r in runs)
    out = []
    for end in range(width, n + 1, width):
        values = [reward for r in runs for _, reward in r["curve"][end - width : end]]
        out.append((runs[0]["curve"][end - 1][0], statistics.fmean(values)))
    return out


def completions_to(curve: list[tuple[int, float]], level: float, width: int = 10):
    """Completions trained on when the `width`-step moving average first reaches `level`."""
    for i in range(len(curve)):
        part = curve[max(0, i - width + 1) : i + 1]
        if statistics.fmean(r for _, r in part) >= level:
            return curve[i][0]
    return None


def level_figures(runs: dict[str, list[dict]]) -> list[dict]:
    """Completions each side needs to reach 50/75/90 % of the reference side's rise (median
    of seeds); the reference is the first side (sync), the candidate the second."""
    ref, new = list(runs)
    first = statistics.fmean(r["first"] for r in runs[ref])
    final = statistics.fmean(r["final"] for r in runs[ref])
    figures = []
    for share in (0.5, 0.75, 0.9):
        level = first + share * (final - first)
        need = {}
        for side, rs in runs.items():
            reached = [completions_to(r["curve"], level) for r in rs]
            need[side] = None if None in reached else statistics.median(reached)
        ratio = need[new] / need[ref] if None not in need.values() else None
        figures.append(
            figure(
                f"completions to reward {level:.3f} ({share:.0%} of {ref}'s rise), {new} / {ref}",
                ratio,
                "x",
                is_ratio=True,
                note=f"median of seeds: {ref} {need[ref]}, {new} {need[new]}",
            )
        )
    return figures


def compare(runs: dict[str, list[dict]], measure: str) -> tuple[list[dict], bool]:
    """Figures of one measure across seeds; whether the candidate (second side) is within
    the reference (first side) seeds' spread."""
    ref, new = list(runs)
    values = {side: [r[measure] for r in rs] for side, rs in runs.items()}
    mean = {side: statistics.fmean(v) for side, v in values.items()}
    spread = {side: max(v) - min(v) for side, v in values.items()}
    gap = mean[ref] - mean[new]
    figures = [figure(f"{measure}: {s} mean of seeds", mean[s], "reward") for s in runs]
    figures += [figure(f"{measure}: {s} spread (max - min)", spread[s], "reward") for s in runs]
    figures += [
        figure(f"{measure}: {new} / {ref}", mean[new] / mean[ref], "x", is_ratio=True),
        figure(
            f"{measure}: {ref} - {new}",
            gap,
            "reward",
            target=spread[ref],
            note=SPREAD.replace("sync", ref),
        ),
    ]
    return figures, gap <= spread[ref]


def verdict_figures(runs: dict[str, list[dict]]) -> tuple[list[dict], str]:
    """The final window (the verdict) and the whole run's mean reward (the curve's area)."""
    ref, new = list(runs)
    final, held = compare(runs, "final")
    whole, whole_held = compare(runs, "run_mean")
    first = statistics.fmean(r["first"] for r in runs[ref])
    sync_final = [r["final"] for r in runs[ref]]
    rise, spread = statistics.fmean(sync_final) - first, max(sync_final) - min(sync_final)
    figures = [figure(f"{ref}: rise, final window - first window", rise, "reward"), *final, *whole]
    figures += level_figures(runs)
    if rise <= spread:
        return (
            figures,
            f"no verdict: the reward did not rise ({ref} {rise:+.4f}, spread {spread:.4f})",
        )
    mean = {s: statistics.fmean(r["final"] for r in rs) for s, rs in runs.items()}
    return figures, (
        f"learning {'holds' if held else 'does NOT hold'}: final-window reward {new} "
        f"{mean[new]:.4f} vs {ref} {mean[ref]:.4f}, {ref} seeds' spread {spread:.4f}, "
        f"{ref} rose {rise:+.4f}; whole-run mean {'within' if whole_held else 'NOT within'} "
        f"the {ref} seeds' spread"
    )


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--first-seed", type=int, default=0, help="seeds first-seed, first-seed+1, ..."
    )
    parser.add_argument("--window", type=int, default=20, help="steps in the first/final window")
    parser.add_argument(
        "--sides",
        default="sync,async",
        help=f"two of {', '.join(SIDE_KEYS)}, comma-separated: the reference, then the "
        "candidate (k1,k4: one step ahead against four)",
    )
    parser.add_argument("--learning-rate", type=float, default=LEARNING["learning_rate"])
    parser.add_argument(
        "--smoke-rewards", action="store_true", help="the recipe's own reward mix instead"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe key for every run (YAML value), e.g. "
        "vllm_importance_sampling_mode=token_truncate",
    )
    args = parser.parse_args(argv)
    sides = args.sides.split(",")
    measurement = Measurement("async_learning", args.output)
    workdir = Path(tempfile.mkdtemp(prefix="bench-async-learning-"))
    rewards = {} if args.smoke_rewards else LEARNING
    keys = dict(rewards, learning_rate=args.learning_rate, max_steps=args.steps)
    for pair in args.set:
        key, _, value = pair.partition("=")
        keys[key] = yaml.safe_load(value)
    keys["save_strategy"] = "no"
    keys["per_device_train_batch_size"] = 8  # the smoke recipe's 8 completions, 1 process
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    with shared_server(workdir, 1, keys) as plan_for:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for side in sides if seed % 2 == 0 else sides[::-1]:
                run_keys = {**keys, "seed": seed, **SIDE_KEYS[side]}
                run = learning_run(workdir, f"{side}-{seed}", plan_for, run_keys, args.window)
                runs[side].append(run)
                print(
                    f"seed {seed} {side}: reward first {run['first']:.4f} final "
                    f"{run['final']:.4f}, {run['median_step_s']:.3f} s/step, "
                    f"{run['wall_s']:.0f} s",
                    flush=True,
                )
    curves = {side: binned(rs, args.window // 2) for side, rs in runs.items()}
    for side, curve in curves.items():
        shown = ", ".join(f"{c}: {r:.3f}" for c, r in curve)
        print(f"{side} reward per completions trained on (mean of seeds): {shown}", flush=True)
    figures, line = verdict_figures(runs) if len(sides) == 2 else ([], "")
    print_figures(figures)
    print(line, flush=True)
    settings = {
        **keys,
        "seeds": args.seeds,
        "first_seed": args.first_seed,
        "window": args.window,
        "sides": sides,
    }
    measurement.finish(figures, settings, verdict=line, curves=curves, runs=runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
