"""Toolkit overhead: src/grpo.py against a bare TRL GRPOTrainer script, same everything else.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_overhead.py [--steps 40] [--warmup 5]
        [--repeats 3 | --repeats 4,2] [--processes 1,2] [--diagnose]

Both sides train the smoke recipe (recipes/smoke/config_grpo.yaml: the tiny Qwen2 model, the
built-in arithmetic rows, the same prompt format, rewards, batch and seed; checkpoints every 10
steps) for --steps optimizer steps: ours through src/grpo.py (recipe checks, guarded rewards,
complete-checkpoint markers, the stop callback), the baseline through bench/bare_trl_grpo.py
(plain trl.GRPOConfig / GRPOTrainer). Both run the command the launcher plans for that many CPU
processes (maxent_grpo.launch.plan.make_plan: `accelerate launch` with its flags), the bare side
with only the entry script swapped. Both run under bench/steptimer.py, which records per-step
wall-clock stamps, TRL's `step_time` metric and each process's peak RSS.

Figures (the first --warmup steps of every run dropped, runs of the two sides alternating
ABBA over --repeats rounds, medians pooled over rounds):
- step_time ratio ours/bare: TRL's step_time (generation, rewards, forward, backward);
- wall step ratio ours/bare: time between consecutive step ends, i.e. everything in the loop
  (optimizer, callbacks, logging, and in the mean: checkpoint saves);
- CPU step ratio ours/bare: the same interval in CPU time of the rank-0 process (all its
  threads), which other processes on a loaded machine barely change: the robust figure when
  the machine is busy;
- peak RSS ratio ours/bare: peak RSS summed over the training processes.
- accounted ratio: (bare's median step + what ours adds per step) / bare's step, with the
  additions timed inside the processes (the product's timers, maxent_grpo/timers.py, which
  steptimer reads at exit): the stop-request callback (a file check; with several processes
  an asynchronous all-reduce cast before the optimizer step, read at the step's end), the
  step-time split (train/step_time.py), the reward guard around the reward functions, the
  heartbeat writes (step end, around each generation), the step events (events.jsonl), and
  the extra time of our checkpoint save (fsync of every file, marker, rotation) / save_steps.
  Far less exposed to other processes' load than the A/B ratios; it does not see costs
  outside these parts (the A/B ratios do). Found by profiling and removed, so no longer
  counted: a rewritten heartbeat file cost 0.5 ms (ext4's replace-by-rename flush; now
  rewritten in place), and a reward-failure metric logged at every step made TRL gather it
  across processes, one collective per reward and step (now logged only on failures);
- checkpoint save: median duration of a save, ours - bare.
--diagnose adds one untimed run per side and process count: the host-device synchronisations
of each step by call site (bench/sync_counter.py; ours' extra ones are named) and each of
ours' actions under torch.profiler (CPU ms per step), bench/steptimer.py's two modes.
Both sides must generate exactly the same completions (checked on num_tokens).
Target: step time ratio <= 1.03. Writes bench/results/overhead.json.
"""

from __future__ import annotations

import json
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
    REPO,
    SMOKE,
    STEPTIMER,
    Measurement,
    bench_parser,
    child_env,
    figure,
    loadavg,
    median,
    planned_training,
    print_figures,
    write_recipe,
)

TARGET_RATIO = 1.03


def run_once(side: str, processes: int, recipe: Path, workdir: Path, tag: str, **env: str) -> dict:
    """One training run under the step timer (env: its diagnostic modes); its records."""
    out = workdir / f"out-{tag}"
    timer_dir = workdir / f"timer-{tag}"
    planned = planned_training(recipe, processes, ["--output_dir", str(out)])
    entry = planned.entry if side == "ours" else (str(BARE_SCRIPT),)
    cmd = planned.with_entry(str(STEPTIMER), *entry)
    log = workdir / f"{tag}.log"
    started = time.monotonic()
    with open(log, "wb") as handle:
        proc = subprocess.run(
            cmd,
            cwd=REPO,
            env=child_env(**planned.env, STEPTIMER_OUT=str(timer_dir), **env),
            stdout=handle,
            stderr=subprocess.STDOUT,
            timeout=900,
        )
    wall = time.monotonic() - started
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        sys.exit(f"{side} run ({processes} processes) failed with {proc.returncode}:\n{tail}")
    ranks = [json.loads(p.read_text()) for p in sorted(timer_dir.glob("rank*.json"))]
    if len(ranks) != processes:
        sys.exit(f"{side} run: expected {processes} timer records, got {len(ranks)}")
    shutil.rmtree(out, ignore_errors=True)
    rank0 = json.loads((timer_dir / "rank0.json").read_text())
    return {"wall_s": wall, "rank0": rank0, "peak_rss_kib": [r["peak_rss_kib"] for r in ranks]}


def steady(record: dict, warmup: int) -> dict:
    """Steady-state figures of one run: steps after the warm-up only."""
    rank0 = record["rank0"]
    step_times = [e["step_time"] for e in rank0["logs"] if e["step"] > warmup]
    stamps = rank0["step_end"]
    pairs = [(a, b) for a, b in zip(stamps, stamps[1:]) if b[0] > warmup]
    steps = len(stamps) or 1
    timers = rank0.get("timers", {})

    def total(name: str) -> float:
        return timers.get(name, {}).get("total_s", 0.0)

    return {
        "step_time_s": step_times,
        "wall_step_s": [b[1] - a[1] for a, b in pairs],
        # The product's own timers (maxent_grpo/timers.py): what ours adds, part by part.
        "save_s": timers.get("checkpoint_save", {}).get("recent_s", []),
        # Several processes vote before the optimizer step and read at the step's end: two
        # calls a step; a per-step figure either way.
        "stop_callback_s": [total("stop_callback") / steps],
        "guard_per_step_s": [(total("reward_guard") - total("reward_func")) / steps],
        # Every beat (step end, around each generation, saves): a per-step figure.
        "heartbeat_per_step_s": [total("heartbeat") / steps],
        "step_events_per_step_s": [total("step_events") / steps],
        "step_time_split_per_step_s": [total("step_time_split") / steps],
        "cpu_step_s": [b[2] - a[2] for a, b in pairs],
        # Minor page faults of rank 0 a step: a heap that maps and unmaps each step's tensors
        # shows here and in no timer (launch/plan/training.py CPU_HEAP).
        "page_faults": [b[3] - a[3] for a, b in pairs if len(a) > 3],
        "peak_rss_mib": sum(record["peak_rss_kib"]) / 1024,
        "train_begin_s": rank0["train_begin"],
        "num_tokens": [e["num_tokens"] for e in rank0["logs"]],
        "wall_s": record["wall_s"],
    }


def compare(processes: int, repeats: int, warmup: int, recipe: Path, workdir: Path) -> dict:
    save_steps = yaml.safe_load(recipe.read_text())["save_steps"]
    runs: dict[str, list[dict]] = {"ours": [], "bare": []}
    for round_ in range(repeats):
        order = ("ours", "bare") if round_ % 2 == 0 else ("bare", "ours")
        for side in order:
            tag = f"{side}-{processes}p-{round_}"
            record = run_once(side, processes, recipe, workdir, tag)
            result = steady(record, warmup)
            runs[side].append(result)
            print(
                f"  {processes} proc, round {round_ + 1}/{repeats}, {side}: median "
                f"step_time {median(result['step_time_s']):.4f} s, wall step "
                f"{median(result['wall_step_s']):.4f} s, CPU step "
                f"{median(result['cpu_step_s']):.4f} s, page faults "
                f"{median(result['page_faults']):.0f}, peak RSS "
                f"{result['peak_rss_mib']:.0f} MiB (load {loadavg()[0]})",
                flush=True,
            )

    def pooled(side: str, key: str) -> list[float]:
        return [v for run in runs[side] for v in run[key]]

    summary: dict = {"processes": processes, "runs": runs}
    for key in ("step_time_s", "wall_step_s", "cpu_step_s"):
        ours, bare = pooled("ours", key), pooled("bare", key)
        summary[key] = {
            "median": {"ours": median(ours), "bare": median(bare)},
            "mean": {"ours": statistics.fmean(ours), "bare": statistics.fmean(bare)},
            "ratio_of_medians": median(ours) / median(bare),
            "ratio_of_means": statistics.fmean(ours) / statistics.fmean(bare),
            "round_ratios": [
                median(o[key]) / median(b[key]) for o, b in zip(runs["ours"], runs["bare"])
            ],
        }
    saves = {side: median(pooled(side, "save_s")) or 0.0 for side in runs}
    summary["checkpoint_save_s"] = {**saves, "extra": saves["ours"] - saves["bare"]}
    # What ours adds per step, timed in-process: load noise barely touches these parts.
    added = {
        "stop_callback_s": median(pooled("ours", "stop_callback_s")) or 0.0,
        "reward_guard_s": median(pooled("ours", "guard_per_step_s")) or 0.0,
        "heartbeats_s": median(pooled("ours", "heartbeat_per_step_s")) or 0.0,
        "step_events_s": median(pooled("ours", "step_events_per_step_s")) or 0.0,
        "step_time_split_s": median(pooled("ours", "step_time_split_per_step_s")) or 0.0,
        "checkpoint_save_s": summary["checkpoint_save_s"]["extra"] / save_steps,
    }
    base = summary["wall_step_s"]["median"]["bare"]
    summary["accounted"] = {
        "added_per_step_s": added,
        "total_added_s": sum(added.values()),
        "bare_wall_step_s": base,
        "ratio": (base + sum(added.values())) / base,
        "save_steps": save_steps,
    }
    summary["page_faults"] = {side: median(pooled(side, "page_faults")) for side in runs}
    rss = {side: median([r["peak_rss_mib"] for r in runs[side]]) for side in runs}
    summary["peak_rss_mib"] = {**rss, "ratio": rss["ours"] / rss["bare"]}
    summary["train_begin_s"] = {
        side: median([r["train_begin_s"] for r in runs[side]]) for side in runs
    }
    tokens = {json.dumps(r["num_tokens"]) for side in runs for r in runs[side]}
    summary["same_completions"] = len(tokens) == 1
    return summary


# Ours' per-step actions, as the product times them (maxent_grpo/timers.py): profiled by name.
ACTIONS = ("stop_callback", "heartbeat", "step_events", "step_time_split", "reward_guard")
PROFILED_STEPS = 4


def sync_sites(syncs: list, warmup: int) -> dict:
    """Median host-device synchronisations per step, in all and by call site."""
    steps = [counts for step, counts in syncs if step > warmup]
    sites = {site for counts in steps for site in counts}
    by_site = {site: median([c.get(site, 0) for c in steps]) for site in sites}
    return {
        "per_step": median([sum(c.values()) for c in steps]),
        "sites": {site: n for site, n in sorted(by_site.items()) if n},
    }


def diagnose(processes: int, warmup: int, recipe: Path, workdir: Path) -> dict:
    """One untimed run per side: the syncs of each step by site (bench/sync_counter.py) and
    torch.profiler's CPU time of each of ours' actions (the stack walks of the sync counter
    are inside the profiled steps: a few microseconds per sync)."""
    first, last = warmup + 1, warmup + PROFILED_STEPS
    found = {}
    for side in ("ours", "bare"):
        tag = f"{side}-{processes}p-diagnosis"
        modes = {"STEPTIMER_SYNCS": "1", "STEPTIMER_PROFILE": f"{first},{last}"}
        rank0 = run_once(side, processes, recipe, workdir, tag, **modes)["rank0"]
        ranges = rank0.get("profile", {}).get("ranges", {})
        found[side] = {
            "syncs_mode": rank0.get("syncs_mode"),
            "syncs": sync_sites(rank0["syncs"], warmup),
            "profile_ms_per_step": {k: v["cpu_ms_per_step"] for k, v in sorted(ranges.items())},
        }
    ours, bare = found["ours"]["syncs"]["sites"], found["bare"]["syncs"]["sites"]
    found["syncs_only_ours"] = {
        site: n - bare.get(site, 0) for site, n in ours.items() if n != bare.get(site, 0)
    }
    return found


def diagnosis_figures(processes: int, found: dict) -> list[dict]:
    ours, bare = found["ours"], found["bare"]
    extra = ours["syncs"]["per_step"] - bare["syncs"]["per_step"]
    sites = "; ".join(f"{n:+g} {site}" for site, n in found["syncs_only_ours"].items())
    profile = ours["profile_ms_per_step"]
    actions = ", ".join(f"{a} {profile.get(f'timer:{a}', 0.0):.3f} ms" for a in ACTIONS)
    return [
        figure(
            f"overhead {processes}p: host-device syncs per step, ours - bare",
            extra,
            "syncs",
            note=f"ours {ours['syncs']['per_step']:g}, bare {bare['syncs']['per_step']:g} "
            f"({ours['syncs_mode']}); ours only: {sites or 'none'}",
        ),
        figure(
            f"overhead {processes}p: ours' actions under torch.profiler (CPU ms per step)",
            sum(profile.get(f"timer:{a}", 0.0) for a in ACTIONS),
            "ms",
            note=actions + " (reward_guard includes the reward functions)",
        ),
    ]


def figures_for(s: dict) -> list[dict]:
    n = s["processes"]
    st, ws, cs = s["step_time_s"], s["wall_step_s"], s["cpu_step_s"]
    acc = s["accounted"]
    parts = acc["added_per_step_s"]
    same = "" if s["same_completions"] else "WARNING: completions differ between runs"
    rounds = ", ".join(f"{r:.3f}" for r in st["round_ratios"])
    return [
        figure(
            f"overhead {n}p: step_time ratio ours/bare",
            st["ratio_of_medians"],
            "x",
            TARGET_RATIO,
            note=f"ours {st['median']['ours']:.4f} s, bare {st['median']['bare']:.4f} s; "
            f"rounds {rounds}{'; ' + same if same else ''}",
        ),
        figure(
            f"overhead {n}p: wall step ratio ours/bare (median)",
            ws["ratio_of_medians"],
            "x",
            TARGET_RATIO,
            note=f"ours {ws['median']['ours']:.4f} s, bare {ws['median']['bare']:.4f} s",
        ),
        figure(
            f"overhead {n}p: CPU time per step ratio ours/bare (load-robust)",
            cs["ratio_of_medians"],
            "x",
            TARGET_RATIO,
            note=f"rank 0 process CPU time: ours {cs['median']['ours']:.4f} s, bare "
            f"{cs['median']['bare']:.4f} s",
        ),
        figure(
            f"overhead {n}p: wall step ratio ours/bare (mean, incl. checkpoint saves)",
            ws["ratio_of_means"],
            "x",
            is_ratio=True,
            note=f"ours {ws['mean']['ours']:.4f} s, bare {ws['mean']['bare']:.4f} s",
        ),
        figure(
            f"overhead {n}p: accounted ratio (bare step + what ours adds, timed in-process)",
            acc["ratio"],
            "x",
            TARGET_RATIO,
            note=f"+{1e3 * acc['total_added_s']:.2f} ms on a {1e3 * acc['bare_wall_step_s']:.1f} "
            f"ms step: stop callback {1e3 * parts['stop_callback_s']:.2f} ms, reward guard "
            f"{1e3 * parts['reward_guard_s']:.3f} ms, heartbeats "
            f"{1e3 * parts['heartbeats_s']:.3f} ms, step events "
            f"{1e3 * parts['step_events_s']:.3f} ms, step-time split "
            f"{1e3 * parts['step_time_split_s']:.3f} ms, checkpoint save "
            f"{1e3 * parts['checkpoint_save_s']:.2f} ms per step (save_steps "
            f"{acc['save_steps']})",
        ),
        figure(
            f"overhead {n}p: checkpoint save, extra time of ours",
            s["checkpoint_save_s"]["extra"],
            "s",
            note=f"per save: ours {s['checkpoint_save_s']['ours']:.3f} s (fsync of every file, "
            f"marker, rotation), bare {s['checkpoint_save_s']['bare']:.3f} s",
        ),
        figure(
            f"overhead {n}p: minor page faults per step, ours - bare",
            s["page_faults"]["ours"] - s["page_faults"]["bare"],
            "faults",
            note=f"rank 0: ours {s['page_faults']['ours']:.0f}, bare "
            f"{s['page_faults']['bare']:.0f} a step",
        ),
        figure(
            f"overhead {n}p: peak RSS ratio ours/bare",
            s["peak_rss_mib"]["ratio"],
            "x",
            is_ratio=True,
            note=f"ours {s['peak_rss_mib']['ours']:.0f} MiB, bare "
            f"{s['peak_rss_mib']['bare']:.0f} MiB (sum over {n} process(es))",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="steps dropped from each run")
    parser.add_argument(
        "--repeats",
        default="3",
        help="rounds (one run per side each); one number, or one per --processes entry (4,2)",
    )
    parser.add_argument("--processes", default="1,2", help="process counts, e.g. 1,2")
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="one more (untimed) run per side: syncs per step by site and ours' actions "
        "under torch.profiler",
    )
    args = parser.parse_args(argv)
    if args.steps <= args.warmup + max(1, PROFILED_STEPS if args.diagnose else 1):
        parser.error(f"--steps must exceed --warmup + 1 (--diagnose: + {PROFILED_STEPS})")

    from maxent_grpo.tiny_model import build_tiny_model

    measurement = Measurement("overhead", args.output)
    summaries = []
    figures = []
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        workdir = Path(tmp)
        model = build_tiny_model(workdir / "tiny-qwen2")
        recipe = write_recipe(
            workdir,
            SMOKE,
            "recipe.yaml",
            model_name_or_path=str(model),
            max_steps=args.steps,
            logging_steps=1,
        )
        counts = [int(p) for p in args.processes.split(",")]
        repeats = [int(r) for r in args.repeats.split(",")]
        repeats += [repeats[-1]] * (len(counts) - len(repeats))
        for processes, rounds in zip(counts, repeats):
            print(f"toolkit overhead, {processes} process(es): src/grpo.py vs bare TRL", flush=True)
            summary = compare(processes, rounds, args.warmup, recipe, workdir)
            new = figures_for(summary)
            if args.diagnose:
                summary["diagnosis"] = diagnose(processes, args.warmup, recipe, workdir)
                new += diagnosis_figures(processes, summary["diagnosis"])
            summaries.append(summary)
            figures += new
            print_figures(new)
    settings = {
        "recipe": "recipes/smoke/config_grpo.yaml",
        "steps": args.steps,
        "warmup_dropped": args.warmup,
        "repeats": repeats,
        "order": "ABBA (ours first in even rounds)",
    }
    measurement.finish(figures, settings, comparisons=summaries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
