"""Run every benchmark, one after the other, and print one table of every figure and ratio.

    make bench        # = OMP_NUM_THREADS=1 .venv/bin/python bench/run_all.py
    .venv/bin/python bench/run_all.py --only overhead,rewards
    .venv/bin/python bench/run_all.py --skip requeue

Benchmarks (each also runs on its own; see its docstring):
  overhead  bench/bench_overhead.py   src/grpo.py vs bare TRL: step time and peak RSS ratios
  maxent    bench/bench_maxent.py     MaxEnt-GRPO vs GRPO step time, same reference model
  rewards   bench/bench_rewards.py    completions per second of each built-in reward
  launcher  bench/bench_launcher.py   training.sh to first step, our own part; vLLM start/sync
  requeue   bench/bench_requeue.py    Slurm signal to first resumed step; steps lost

Every figure is printed with its unit and, where there is a target, value/target and
met/MISSED. The exit code is 0 when every benchmark ran (a missed target is a measurement, not
an error) and 1 when one of them failed. Writes bench/results/summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchlib import (
    PYTHON,
    REPO,
    RESULTS_DIR,
    figure,
    format_figure,
    loadavg,
    machine,
    verdict,
)

BENCH = REPO / "bench"
# name -> (script, arguments, results file). Sized for ~15 minutes on a 2-core CPU VM.
BENCHMARKS = {
    "overhead": ("bench_overhead.py", ["--steps", "30", "--repeats", "4,3"], "overhead.json"),
    "maxent": ("bench_maxent.py", ["--rounds", "2"], "maxent_vs_grpo.json"),
    "rewards": ("bench_rewards.py", [], "rewards.json"),
    "launcher": ("bench_launcher.py", ["--repeats", "3"], "launcher.json"),
    "requeue": ("bench_requeue.py", [], "requeue.json"),
}
MAXENT_TARGET = 1.10


def maxent_figures(result: dict) -> list[dict]:
    """bench_maxent.py writes its own format: turn it into figures."""
    medians = result.get("median_step_s", {})
    target = result.get("target", MAXENT_TARGET)
    figures = [
        figure(
            "maxent: step time ratio MaxEnt/GRPO (same reference model)",
            result["ratio_maxent_over_grpo"],
            "x",
            target,
            note=f"GRPO {medians.get('grpo', 0):.4f} s, MaxEnt {medians.get('maxent', 0):.4f} s",
        ),
        figure(
            "maxent: median of per-round ratios",
            result.get("median_round_ratio"),
            "x",
            is_ratio=True,
            note="rounds " + ", ".join(f"{r:.3f}" for r in result.get("round_ratios", [])),
        ),
    ]
    components = result.get("components") or {}
    if "loss_backward_ratio" in components:
        figures.append(
            figure(
                "maxent: in-process loss+backward ratio MaxEnt/GRPO",
                components["loss_backward_ratio"],
                "x",
                is_ratio=True,
                note=f"MaxEnt {components.get('maxent_loss_backward_ms', 0):.2f} ms, GRPO "
                f"{components.get('grpo_loss_backward_ms', 0):.2f} ms; weights "
                f"{components.get('weights_per_generation_batch_ms', 0):.2f} ms per batch",
            )
        )
    return figures


def run_benchmark(name: str) -> dict:
    script, args, results_file = BENCHMARKS[name]
    path = BENCH / script
    entry = {"name": name, "script": f"bench/{script}", "load_before": loadavg()}
    if not path.is_file():
        print(f"== {name}: skipped: {path.relative_to(REPO)} does not exist", flush=True)
        entry.update(status="skipped", figures=[])
        return entry
    output = RESULTS_DIR / results_file
    command = [PYTHON, str(path), *args, "--output", str(output)]
    print(f"== {name}: {' '.join(command[1:])} (load {entry['load_before']})", flush=True)
    started = time.monotonic()
    wall_start = time.time()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, cwd=REPO, env=env)
    entry.update(wall_s=time.monotonic() - started, load_after=loadavg())
    entry["returncode"] = proc.returncode
    fresh = output.is_file() and output.stat().st_mtime >= wall_start
    if proc.returncode != 0 or not fresh:
        print(f"== {name}: FAILED (exit code {proc.returncode})", flush=True)
        entry.update(status="failed", figures=[])
        return entry
    result = json.loads(output.read_text())
    entry["figures"] = maxent_figures(result) if name == "maxent" else result["figures"]
    entry["status"] = "ok"
    print(f"== {name}: done in {entry['wall_s']:.0f} s (load {entry['load_after']})", flush=True)
    return entry


def print_summary(entries: list[dict], wall_s: float) -> None:
    print()
    print(f"Summary (all benchmarks: {wall_s / 60:.1f} min; load average now {loadavg()})")
    rows = [("benchmark", "figure", "value", "target", "value/target", "verdict")]
    for entry in entries:
        if entry["status"] != "ok":
            rows.append((entry["name"], "-", "-", "-", "-", entry["status"].upper()))
            continue
        for fig in entry["figures"]:
            value = fig["value"]
            unit = fig["unit"]
            if value is None:
                shown = "n/a"
            elif unit == "x":
                shown = f"{value:.3f}x"
            else:
                shown = f"{value:,.3f} {unit}" if abs(value) < 100 else f"{value:,.0f} {unit}"
            target = "-" if fig["target"] is None else f"<= {fig['target']:g}"
            ratio = "-" if fig["ratio"] is None else f"{fig['ratio']:.3f}"
            why = verdict(fig) if value is not None else (fig["note"] or "n/a")
            rows.append((entry["name"], fig["name"], shown, target, ratio, why))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * width for width in widths))
    missed = [f for e in entries for f in e["figures"] if f["met"] is False]
    if missed:
        print(f"\nMISSED {len(missed)} target(s):")
        for fig in missed:
            print("  " + format_figure(fig))
    else:
        print("\nEvery target with a measurement was met.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated benchmarks to run")
    parser.add_argument("--skip", default="", help="comma-separated benchmarks to skip")
    args = parser.parse_args(argv)
    names = list(BENCHMARKS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
    skip = {n.strip() for n in args.skip.split(",") if n.strip()}
    unknown = sorted((set(names) | skip) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")

    started = time.monotonic()
    load_before = loadavg()
    entries = [run_benchmark(name) for name in names if name not in skip]
    wall = time.monotonic() - started
    print_summary(entries, wall)
    summary = {
        "benchmarks": entries,
        "load_average": {"before": load_before, "after": loadavg()},
        "machine": machine(),
        "wall_s": wall,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"results: {RESULTS_DIR / 'summary.json'}")
    return 1 if any(e["status"] == "failed" for e in entries) else 0


if __name__ == "__main__":
    sys.exit(main())
