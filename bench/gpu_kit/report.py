"""The GPU kit's report: OUT/gpu_kit.md (tables), OUT/gpu_kit.json, OUT/gpu_kit_logs.txt.

Reads what the steps left in the work folder (bench/gpu_kit/kit.py): W/steps/NAME.rc
("EXIT SECONDS CAP [note]" from gpu_kit.sh, or "skipped ..." when the budget ran out) and
W/results/NAME.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

ORDER = ("install", "model", "overhead", "signal", "oom", "maxent", "checkpointing", "zero2")
TIMED_OUT = (124, 137)


def read_steps(work: Path) -> dict:
    """Each step's status, seconds, exit code, one-line detail and figures."""
    steps = {}
    for name in ORDER:
        rc_file = work / "steps" / f"{name}.rc"
        found = work / "results" / f"{name}.json"
        result = json.loads(found.read_text()) if found.exists() else {}
        if not rc_file.exists():
            steps[name] = {"status": "not run", "seconds": 0.0, "detail": "", "result": result}
            continue
        words = rc_file.read_text().split()
        if words[0] == "skipped":
            steps[name] = {"status": "skipped", "seconds": 0.0, "result": result}
            steps[name]["detail"] = " ".join(words[2:])
            continue
        code, seconds, cap = int(words[0]), float(words[1]), words[2]
        entry = {"exit": code, "seconds": round(seconds, 1), "cap_s": cap, "result": result}
        if name == "install":
            entry["status"] = "ok" if code == 0 else "failed"
            entry["detail"] = " ".join(words[3:])
        elif "skipped" in result:
            entry["status"], entry["detail"] = "skipped", result["skipped"]
        elif code in TIMED_OUT:
            entry["status"] = "timed out"
            entry["detail"] = f"stopped at its bound of {cap} s"
        elif code == 0 and result.get("ok"):
            entry["status"], entry["detail"] = "ok", summary(name, result)
        else:
            entry["status"] = "failed"
            entry["detail"] = result.get("error") or f"exit {code}, no result written"
        steps[name] = entry
    return steps


def _x(value) -> str:
    return "n/a" if value is None else f"{value:.3f}x"


def summary(name: str, r: dict) -> str:
    """One line of figures per step, for the first table."""
    if name == "model":
        return f"{r['layers']} layers, hidden {r['hidden']}, vocab {r['vocab']} (random weights)"
    if name == "overhead":
        parts = [
            f"{side}: step time {_x(q['step_time'])}, tokens/s {_x(q['completion_tokens_per_s'])},"
            f" memory {_x(q['peak_memory'])}"
            for side, q in r["ratios"].items()
        ]
        return "ours/bare " + "; ".join(parts)
    if name == "signal":
        stop = r["stop"]
        return (
            f"SIGUSR1 after step {stop['signal_after_step']}: exit {stop['exit']}, "
            f"{stop['checkpoint']} complete; resumed; final weights equal to an uninterrupted "
            f"run's: {str(r['weights_equal']).lower()} (max abs diff {r['max_abs_diff']})"
        )
    if name == "oom":
        return f"outcome {r['outcome']}, {r['attempts']} attempt, exit {r['exit']}: {r['reason']}"
    q = r["ratios"]
    label = {"maxent": "MaxEnt/GRPO", "checkpointing": "on/off", "zero2": "ZeRO-2/plain"}[name]
    return f"{label}: step time {_x(q['step_time'])}, memory {_x(q['peak_memory'])}"


def run_rows(steps: dict, mode: str) -> list[tuple[str, dict]]:
    """Every training run the steps made, labelled."""
    rows = []
    picks = {
        "overhead": [("bare", "bare TRL"), ("module", "ours: python -m maxent_grpo.train")]
        + [("training.sh", "ours: bash training.sh")],
        "maxent": [("maxent", "MaxEnt-GRPO (python -m)")],
        "checkpointing": [("on", "gradient checkpointing on (python -m)")],
        "zero2": [("zero2", "DeepSpeed ZeRO-2 (training.sh)")],
    }
    for name, pairs in picks.items():
        if name not in steps:
            continue
        result = steps[name]["result"]
        runs = result.get("runs", result)
        for key, label in pairs:
            if isinstance(runs.get(key), dict):
                rows.append((label, runs[key]))
    return rows


def markdown(steps: dict, mode: str, total: float, conflicts: list[str] = ()) -> str:
    model = steps["model"]["result"]
    device = model.get("device", "unknown (the model step failed)")
    memory = "peak GPU memory (MiB, max_memory_allocated)" if mode == "gpu" else "peak RSS (MiB)"
    key = "peak_gpu_mib" if mode == "gpu" else "peak_rss_mib"
    lines = [
        f"# GPU proof kit: {device}",
        "",
        f"Mode {mode}; torch {model.get('torch')}, CUDA {model.get('cuda')}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; whole run {total:.0f} s.",
        "",
        "Needs of the carried wheels that the installed versions break: "
        + ("; ".join(conflicts) if conflicts else "none")
        + ".",
        "",
        "| step | status | seconds | result |",
        "| --- | --- | ---: | --- |",
    ]
    for name in ORDER:
        s = steps[name]
        detail = s["detail"].replace("|", "/")
        lines.append(f"| {name} | {s['status']} | {s['seconds']:.0f} | {detail} |")
    lines += [
        "",
        "## Training runs (1 process, same recipe file, seed and data)",
        "",
        f"| run | step time (s, median) | completion tokens/s | {memory} | whole run (s) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for label, run in run_rows(steps, mode):
        lines.append(
            f"| {label} | {run['step_time_s']} | {run['completion_tokens_per_s']} | "
            f"{run.get(key)} | {run['wall_s']} |"
        )
    lines += ["", "## Where the time went", "", "| step | seconds | per training step (s) |"]
    lines.append("| --- | ---: | --- |")
    for name in ORDER:
        runs = [run for _, run in run_rows({name: steps[name]}, mode)]
        per_step = "; ".join(" ".join(f"{t:g}" for t in r["step_times_s"]) for r in runs)
        lines.append(f"| {name} | {steps[name]['seconds']:.0f} | {per_step} |")
    return "\n".join(lines) + "\n"


def write_report(kit, out: Path, total: float) -> int:
    out.mkdir(parents=True, exist_ok=True)
    steps = read_steps(kit.work)
    found = kit.work / "conflicts.txt"  # gpu_kit.sh: packages.py conflicts, after the install
    conflicts = found.read_text().splitlines() if found.exists() else []
    text = markdown(steps, kit.mode, total, conflicts)
    (out / "gpu_kit.md").write_text(text)
    doc = {
        "mode": kit.mode,
        "device": steps["model"]["result"].get("device"),
        "total_s": total,
        "version_conflicts": conflicts,
        "steps": steps,
    }
    (out / "gpu_kit.json").write_text(json.dumps(doc, indent=1))
    logs = [f"== version conflicts: {doc['version_conflicts'] or 'none'}"]
    for log in sorted((kit.work / "logs").glob("*.log")):
        logs += [f"== {log.name} (last 40 lines)", kit.log_tail(log.stem, 40)]
    (out / "gpu_kit_logs.txt").write_text("\n".join(logs) + "\n")
    print(text, flush=True)
    failed = [n for n, s in steps.items() if s["status"] in ("failed", "timed out", "not run")]
    return 1 if failed else 0
