"""The GPU proof kit's command line (scripts/gpu_kit.sh runs it; see there).

    python bench/gpu_kit/kit.py step NAME --work W --mode gpu|cpu
    python bench/gpu_kit/kit.py cap NAME --work W --mode gpu|cpu
    python bench/gpu_kit/kit.py report --work W --mode gpu|cpu --out OUT --total SECONDS

`step` runs one step (kit_steps.py) and writes W/results/NAME.json ({"ok": true, ...figures}
or {"skipped": why} or {"error": one line}; {"partial": true, ...} while a step is under way).
`cap` prints the seconds a step may take: its work (runs and steps) at the cost the warm-up
run measured, twice over on GPU (four times on CPU, where the kit runs as a test beside other
work and a step's cost swings with the machine's load), plus 30 s, so that more steps get a
longer bound and a step does not come back empty because of a fixed one. `report` turns the
results, with the exit codes and seconds gpu_kit.sh recorded in W/steps/NAME.rc, into
OUT/gpu_kit.md, OUT/gpu_kit.json and OUT/gpu_kit_logs.txt (report.py). GPU_KIT_TIMED_STEPS:
timed steps per side of the ABBA comparison (default 30).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import kit_steps
from kit_runs import Kit, one_line, stop_children

STEPS = ("model", "warmup", "overhead", "signal", "oom", "maxent", "checkpointing", "zero2")
FIXED_CAPS = {"model": {"gpu": 120, "cpu": 180}, "warmup": {"gpu": 150, "cpu": 240}}
NO_WARMUP_CAP = 600  # no cost measured: the kit's budget is the bound
# A bound's margin over the warm-up's cost. CI's CPU run saw a bare-TRL run take 80 s where
# the warm-up predicted 24 (the machine's other lane at its busiest); the GPU run has a lent
# machine to itself and a budget to keep.
MARGIN = {"gpu": 2, "cpu": 4}


def work(kit: Kit, name: str) -> list[tuple[int, float, float]]:
    """A step's runs: (steps, cost of a step, cost of a start) relative to the warm-up's
    (training.sh starts the launcher and accelerate too; checkpointing recomputes)."""
    n, grpo = kit.run_steps, kit.result("overhead") or {}
    baseline = [] if "module" in grpo.get("sides", {}) else [(n, 1.0, 1.0)]
    # The signal step's uninterrupted run is the warm-up's (the cap needs it done anyway).
    signal_steps = kit_steps.SIGNAL_STEPS[kit.mode]
    return {
        "overhead": [(n, 1.0, 1.0)] * len(kit_steps.ABBA),
        "signal": [(signal_steps, 1.0, 1.5)] * 2,
        "oom": [(0, 1.0, 1.5)],
        "maxent": baseline + [(n, 1.5, 1.0)],
        "checkpointing": baseline + [(n, 4.0, 1.0)],
        "zero2": baseline + [(n, 2.0, 2.0)],
    }[name]


def cap(kit: Kit, name: str) -> int:
    if name in FIXED_CAPS:
        return FIXED_CAPS[name][kit.mode]
    warm = kit.result("warmup") or {}
    if not warm.get("ok"):
        return NO_WARMUP_CAP
    seconds = sum(
        warm["fixed_s"] * start + steps * warm["step_s"] * step
        for steps, step, start in work(kit, name)
    )
    return math.ceil(MARGIN[kit.mode] * seconds + 30)


def run_step(kit: Kit, name: str) -> int:
    signal.signal(signal.SIGTERM, stop_children)
    started = time.monotonic()
    try:
        found = getattr(kit_steps, f"step_{name}")(kit)
        found = found if "skipped" in found else {"ok": True, **found}
        code = 0
    except Exception as exc:  # the report says why; the other steps go on
        traceback.print_exc()
        partial = kit.result(name) or {}
        found = {**partial, "error": one_line(f"{type(exc).__name__}: {exc}")}
        code = 1
    found["seconds"] = round(time.monotonic() - started, 1)
    (kit.work / "results" / f"{name}.json").write_text(json.dumps(found, indent=1))
    print(json.dumps(found)[:2000], flush=True)
    return code


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("step", "cap", "report"))
    parser.add_argument("name", nargs="?", choices=STEPS)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--mode", choices=("gpu", "cpu"), required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--total", type=float, default=0.0)
    args = parser.parse_args(argv)
    timed = int(os.environ.get("GPU_KIT_TIMED_STEPS") or 30)
    kit = Kit(args.work, args.mode, timed_steps=timed)
    if args.what == "step":
        return run_step(kit, args.name)
    if args.what == "cap":
        print(cap(kit, args.name))
        return 0
    from report import write_report

    return write_report(kit, args.out, args.total)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
