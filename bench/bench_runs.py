"""How fast `maxent-grpo runs` reads hundreds of runs.

    .venv/bin/python bench/bench_runs.py [--runs 300] [--steps 200] [--big 10] [--repeat 5]

Generates --runs fake runs in a temporary directory, laid out as the toolkit writes them
(outputs/<run>/ with its event log written by `emit`, markers, checkpoints and
trainer_state.json; logs/<run>_..._train.log, named by the launcher and never read), in every
state: completed, running (Slurm), requeued, failed, killed (Slurm and local), stopped. --big of
the runs log --big-steps steps (an event log of megabytes) and have a 2 GiB train log (sparse),
to show that neither is read whole. Then times `collect_runs` + `format_table` (in-process,
--repeat times: first and median) and the whole `maxent-grpo runs` command (a fresh
interpreter), and writes bench/results/runs.json. Target: the table for 300 runs in well under
a second.

`make_fake_runs` is also used by tests/test_runs.py to check the states (no timing there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import REPO

from maxent_grpo.rundir.events import emit, events_path

RESULTS = REPO / "bench" / "results" / "runs.json"
TARGET_S = 1.0
BIG_LOG_BYTES = 2 * 1024**3

KINDS = ("completed", "running", "requeued", "failed", "killed", "stopped", "killed-local")
EXPECTED_STATE = {
    "completed": "completed",
    "running": "running",
    "requeued": "requeued",
    "failed": "failed",
    "killed": "failed",
    "stopped": "stopped",
    "killed-local": "failed",
}

_REWARD_FUNCS = ("answer_match", "format", "tag_count")


def metrics(step: int, maxent: bool) -> dict[str, float]:
    """A step's logged scalars, as the trainer logs them."""
    reward = 0.1 + step / 1000
    items = {"loss": 0.01, "grad_norm": 0.5, "learning_rate": 1e-06, "num_tokens": 1028.0 * step}
    items.update({"completions/mean_length": 27.5, "completions/min_length": 3.0})
    items["completions/max_length"] = 32.0
    for name in _REWARD_FUNCS:
        items[f"rewards/{name}/mean"] = reward
        items[f"rewards/{name}/std"] = 0.1
    items.update(reward=reward, reward_std=0.2, entropy=5.851)
    if maxent:
        items.update({"maxent/weight_entropy": 1.34, "maxent/ess": 3.6, "maxent/beta": 0.05})
    items.update(step_time=0.55, epoch=step / 1000)
    return items


def state_json(steps: int, total: int, maxent: bool) -> str:
    history = [{**metrics(step, maxent), "step": step} for step in range(1, steps + 1)]
    state = {"global_step": steps, "log_history": history, "max_steps": total}
    return json.dumps(state, indent=2, sort_keys=True)


def _write(path: Path, text: str, size: int = 0, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        if size:
            handle.truncate(size)  # a hole: no disk used, reads as zeros
            handle.seek(size)
        handle.write(text.encode())
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def _checkpoint(out: Path, step: int, total: int, maxent: bool, complete: bool = True) -> None:
    ckpt = out / f"checkpoint-{step}"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "trainer_state.json").write_text(state_json(step, total, maxent))
    cls = (
        b"maxent_grpo.maxent.config\nMaxEntConfig" if maxent else b"maxent_grpo.configs\nGRPOConfig"
    )
    (ckpt / "training_args.bin").write_bytes(b"PK\x03\x04" + b"\x00" * 64 + cls + b"\x00" * 64)
    if complete:
        (ckpt / "maxent_grpo_complete.json").write_text(json.dumps({"step": step}))
        emit(out, "checkpoint", step=step, path=str(ckpt))


def _attempt(out: Path, job: str | None, maxent: bool, first: int, last: int, total: int) -> None:
    """An attempt's start and its logged steps, with a complete checkpoint halfway."""
    host = "node-1" if job else socket.gethostname()
    method = "maxent" if maxent else "grpo"
    emit(out, "attempt_start", method=method, recipe="r.yaml", job=job, attempt=1, host=host)
    emit(out, "plan", device="cuda", train_processes=8, nodes=1, server=None)
    for step in range(first, last + 1):
        emit(out, "step", step=step, metrics=metrics(step, maxent), max_steps=total)
        if step == total // 2:
            _checkpoint(out, step, total, maxent)


def _fake_run(out: Path, kind: str, job: str | None, maxent: bool, steps: int, now: float):
    half = steps // 2
    if kind == "completed":
        _attempt(out, job, maxent, 1, steps, steps)
        _checkpoint(out, steps, steps, maxent)
        (out / "trainer_state.json").write_text(state_json(steps, steps, maxent))
        marker = {"method": "maxent" if maxent else "grpo", "global_step": steps}
        (out / "maxent_grpo_training_complete.json").write_text(json.dumps(marker))
        emit(out, "outcome", outcome="completed", reason="", code=0, step=steps)
    elif kind == "running":
        _attempt(out, job, maxent, 1, half + 15, steps)
        _checkpoint(out, half + 10, steps, maxent, complete=False)  # a save in progress
    elif kind in ("requeued", "stopped"):
        _attempt(out, job, maxent, 1, half, steps)
        emit(out, "stop_request", reason="SIGUSR1 received")
        requeue = {"requeue": job} if kind == "requeued" else {}
        if kind == "stopped":
            (out / "maxent_grpo_stop_requested").write_text('{"reason": "test"}')
        emit(out, "outcome", outcome="stopped", reason="SIGUSR1", code=85, step=half, **requeue)
    elif kind == "failed":
        _attempt(out, job, maxent, 1, 7, steps)
        reason = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
        emit(out, "outcome", outcome="failed", reason=reason, code=1, step=None)
    else:  # killed: no outcome, nothing live, nothing written for two hours
        _attempt(out, job, maxent, 1, half + 3, steps)
    if kind in ("failed", "killed", "killed-local"):
        os.utime(events_path(out), (now - 7200, now - 7200))


def make_fake_runs(
    root: Path,
    count: int = 300,
    steps: int = 200,
    big: int = 0,
    big_steps: int = 20_000,
    now: float | None = None,
) -> dict[str, str]:
    """`count` runs under root/outputs and root/logs; returns {run name: expected state}."""
    now = time.time() if now is None else now
    outputs, logs = root / "outputs", root / "logs"
    outputs.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    expected = {}
    for index in range(count):
        kind = KINDS[index % len(KINDS)]
        name = f"run{index:04d}-{kind}"
        job = None if kind in ("stopped", "killed-local") else str(100000 + index)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now - 3600 + index))
        log = f"{name}_job{job}_{stamp}_train.log" if job else f"{name}_{stamp}_train.log"
        stale = kind in ("failed", "killed", "killed-local")
        size = BIG_LOG_BYTES if index < big else 0
        _write(logs / log, "free-form text\n", size, mtime=now - 7200 if stale else None)
        run_steps = big_steps if index < big else steps
        _fake_run(outputs / name, kind, job, index % 2 == 1, run_steps, now)
        expected[name] = EXPECTED_STATE[kind]
    return expected


def _timed(fn, repeat: int) -> tuple[float, float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times[0], statistics.median(times), result


def _report(args, log_bytes: int, event_bytes: int) -> dict:
    """What was measured on: the runs made and the machine."""
    return {
        "runs": args.runs,
        "logged_steps_per_run": args.steps,
        "big_runs": args.big,
        "big_run_steps": args.big_steps,
        "train_log_bytes_total": log_bytes,
        "event_log_bytes_total": event_bytes,
        "target_s": TARGET_S,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=200, help="logged steps per run")
    parser.add_argument("--big", type=int, default=10, help="runs with long event logs")
    parser.add_argument("--big-steps", type=int, default=20_000, help="their logged steps")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args(argv)

    from maxent_grpo.runs import collect_runs, format_table

    with tempfile.TemporaryDirectory(prefix="bench-runs-") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        expected = make_fake_runs(root, args.runs, args.steps, args.big, args.big_steps)
        made = time.perf_counter() - start
        log_bytes = sum(p.stat().st_size for p in (root / "logs").iterdir())
        event_bytes = sum(p.stat().st_size for p in root.glob("outputs/*/events.jsonl"))
        dirs = [str(root / "outputs"), str(root / "logs")]

        def table():
            runs = collect_runs(dirs)
            return runs, format_table(runs)

        first, median, (runs, text) = _timed(table, args.repeat)
        wrong = {r.run: r.state for r in runs if expected.get(r.run) != r.state}
        cli = [str(Path(sys.executable).parent / "maxent-grpo"), "runs"]
        cli += [x for d in dirs for x in ("--dir", d)]
        cli_first, cli_median, result = _timed(
            lambda: subprocess.run(cli, capture_output=True, text=True, check=True), 3
        )
        lines = result.stdout.count("\n")

    report = {
        **_report(args, log_bytes, event_bytes),
        "collect_and_format_s": {"first": round(first, 4), "median": round(median, 4)},
        "cli_wall_s": {"first": round(cli_first, 4), "median": round(cli_median, 4)},
        "table_lines": lines,
        "wrong_states": wrong,
        "generate_s": round(made, 2),
    }
    print(text.splitlines()[0])
    print("\n".join(text.splitlines()[1:4]), "\n...")
    print(
        f"{args.runs} runs ({event_bytes / 1e6:.0f} MB of event logs, {log_bytes / 1e9:.1f} GB "
        f"of train logs; {args.big} runs of {args.big_steps} steps with a 2 GiB log): "
        f"collect+format first {first * 1000:.0f} ms, median {median * 1000:.0f} ms; "
        f"`maxent-grpo runs` wall first {cli_first * 1000:.0f} ms, "
        f"median {cli_median * 1000:.0f} ms"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")
    if wrong:
        print(f"FAIL: wrong states: {wrong}")
        return 1
    if median > TARGET_S:
        print(f"FAIL: {median:.2f}s > target {TARGET_S}s")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
