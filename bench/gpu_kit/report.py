"""The GPU kit's report: OUT/gpu_kit.md (tables), OUT/gpu_kit.json, OUT/gpu_kit_logs.txt.

Reads what the steps left in the work folder (bench/gpu_kit/kit.py): W/steps/NAME.rc
("EXIT SECONDS CAP [note]" from gpu_kit.sh, or "skipped ..." when the budget ran out) and
W/results/NAME.json (a step that ran out of time leaves what it measured before).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

ORDER = (
    "install",
    "model",
    "warmup",
    "overhead",
    "signal",
    "oom",
    "maxent",
    "checkpointing",
    "zero2",
)
TIMED_OUT = (124, 137)
SIDES = {"bare": "bare TRL", "module": "ours: python -m maxent_grpo.train"}


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
        entry["status"], entry["detail"] = status(name, code, cap, words[3:], result)
        steps[name] = entry
    return steps


def status(name: str, code: int, cap: str, note: list[str], result: dict) -> tuple[str, str]:
    if name == "install":
        return ("ok" if code == 0 else "failed"), " ".join(note)
    if "skipped" in result:
        return "skipped", result["skipped"]
    if code in TIMED_OUT:
        measured = partial_summary(name, result)
        measured = f"; {measured}" if measured else ""
        return "timed out", f"stopped at its bound of {cap} s{measured}"
    if code == 0 and result.get("ok"):
        return "ok", summary(name, result)
    return "failed", result.get("error") or f"exit {code}, no result written"


def _x(value) -> str:
    return "n/a" if value is None else f"{value:.3f}x"


def partial_summary(name: str, r: dict) -> str:
    if name != "overhead" or not r.get("runs"):
        return ""
    done = f"{len(r['runs'])} of 4 runs done"
    return f"{done}: {summary(name, r)}" if "ratios" in r else done


def summary(name: str, r: dict) -> str:
    """One line of figures per step, for the first table."""
    if name == "model":
        return f"{r['layers']} layers, hidden {r['hidden']}, vocab {r['vocab']} (random weights)"
    if name == "warmup":
        return (
            f"untimed run of ours ({r['run']['steps']} steps): {r['fixed_s']} s outside its "
            f"steps, {r['step_s']} s a step; the later steps' bounds follow from these"
        )
    if name == "overhead":
        q, n = r["ratios"], [s["timed_steps"] for s in r["sides"].values()]
        return (
            f"ours/bare over {min(n)} timed steps a side (ABBA): median step "
            f"{_x(q['step_time'])}, minimum step {_x(q['step_time_min'])}, tokens/s "
            f"{_x(q['completion_tokens_per_s'])}, memory {_x(q['peak_memory'])}; by round "
            + ", ".join(_x(x) for x in r["round_ratios"])
        )
    if name == "signal":
        stop = r["stop"]
        return (
            f"SIGUSR1 after step {stop['signal_after_step']}: exit {stop['exit']}, "
            f"{stop['checkpoint']} complete; resumed at step {r['resumed_steps'][0]}; final "
            f"weights equal to an uninterrupted run's: {str(r['weights_equal']).lower()} (max "
            f"abs diff {r['max_abs_diff']}), which moved by {r['moved']:.3g} from the model's"
        )
    if name == "oom":
        return f"outcome {r['outcome']}, {r['attempts']} attempt, exit {r['exit']}: {r['reason']}"
    q = r["ratios"]
    label = {"maxent": "MaxEnt/GRPO", "checkpointing": "on/off", "zero2": "ZeRO-2/plain"}[name]
    return (
        f"{label}: step time {_x(q['step_time'])} (minimum {_x(q['step_time_min'])}), "
        f"memory {_x(q['peak_memory'])}"
    )


def run_rows(steps: dict) -> list[tuple[str, dict]]:
    """Every training run the steps made, labelled, in the order they ran."""
    rows = []
    for name, key, label in (
        ("warmup", "run", "warm-up: ours, untimed (the signal step's uninterrupted run)"),
        ("overhead", None, None),
        ("signal", "stopped_run", "signal: stopped by SIGUSR1 (training.sh)"),
        ("signal", "resumed_run", "signal: resumed (training.sh)"),
        ("maxent", "maxent", "MaxEnt-GRPO (python -m)"),
        ("checkpointing", "on", "gradient checkpointing on (python -m)"),
        ("zero2", "zero2", "DeepSpeed ZeRO-2 (training.sh)"),
    ):
        result = steps.get(name, {}).get("result", {})
        if key is None:
            runs = enumerate(result.get("runs", []), 1)
            rows += [(f"{SIDES[r['side']]}, run {i}", r) for i, r in runs]
        elif isinstance(result.get(key), dict):
            rows.append((label, result[key]))
    return rows


def _min_grad(run: dict) -> str:
    norms = [g for g in run.get("grad_norms", []) if g is not None]
    return "missing" if not norms else f"{min(norms):.3g}"


def abba_table(result: dict, memory: str, key: str) -> list[str]:
    sides = result.get("sides", {})
    if not sides:
        return []
    lines = [
        "",
        "## Ours against bare TRL",
        "",
        f"After the warm-up, in the order {', '.join(result['order'])} (ABBA); each run's "
        "first steps left out. Ratios are ours/bare.",
        "",
        f"| side | runs | timed steps | median step (s) | minimum step (s) | tokens/s | {memory} |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for side, s in sides.items():
        lines.append(
            f"| {SIDES[side]} | {s['runs']} | {s['timed_steps']} | {s['step_time_s']} | "
            f"{s['step_time_min_s']} | {s['completion_tokens_per_s']} | {s.get(key)} |"
        )
    if "ratios" in result:
        q = result["ratios"]
        lines.append(
            f"| ours/bare | | | {_x(q['step_time'])} | {_x(q['step_time_min'])} | "
            f"{_x(q['completion_tokens_per_s'])} | {_x(q['peak_memory'])} |"
        )
    return lines


def markdown(steps: dict, mode: str, total: float, conflicts: list[str] = ()) -> str:
    model = steps["model"]["result"]
    device = model.get("device", "unknown (the model step failed)")
    memory = "peak GPU memory (MiB)" if mode == "gpu" else "peak RSS (MiB)"
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
    lines += abba_table(steps["overhead"]["result"], memory, key)
    lines += [
        "",
        "## Training runs (1 process, same recipe file, seed and data)",
        "",
        f"| run | steps | median step (s) | minimum step (s) | tokens/s | {memory} | "
        "smallest grad_norm | whole run (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, run in run_rows(steps):
        lines.append(
            f"| {label} | {run['steps']} | {run['step_time_s']} | {run['step_time_min_s']} | "
            f"{run['completion_tokens_per_s']} | {run.get(key)} | {_min_grad(run)} | "
            f"{run['wall_s']} |"
        )
    lines += ["", "## Where the time went", "", "| step | seconds | bound (s) | step times (s) |"]
    lines.append("| --- | ---: | ---: | --- |")
    for name in ORDER:
        runs = [run for _, run in run_rows({name: steps[name]})]
        per_step = "; ".join(" ".join(f"{t:g}" for t in r["step_times_s"]) for r in runs)
        cap = steps[name].get("cap_s", "")
        lines.append(f"| {name} | {steps[name]['seconds']:.0f} | {cap} | {per_step} |")
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
