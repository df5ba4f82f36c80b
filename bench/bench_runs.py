"""How fast `maxent-grpo runs` reads hundreds of runs.

    .venv/bin/python bench/bench_runs.py [--runs 300] [--steps 200] [--big 10] [--repeat 5]

Generates --runs fake runs in a temporary directory, laid out exactly as the toolkit writes
them (outputs/<run>/ with markers, checkpoints and trainer_state.json; logs/<run>_..._train.log
with progress bars and the trainer's metric lines; slurm_<jobid>.out with the launcher's
lines), in every state: completed, running (Slurm), requeued, failed, killed (Slurm and
local), stopped. --big of the train logs are 2 GiB (sparse: a hole, then the real tail), to
show that only tails are read. Then times `collect_runs` + `format_table` (in-process, --repeat
times: first and median) and the whole `maxent-grpo runs` command (a fresh interpreter), and
writes bench/results/runs.json. Target: the table for 300 runs in well under a second.

`make_fake_runs` is also used by tests/test_runs.py to check the states (no timing there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "runs.json"
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
_ELASTIC_FAILURE = (
    "Traceback (most recent call last):\n"
    '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383\n'
    "    raise ChildFailedError(\n"
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    "============================================================\n"
    "/repo/src/grpo.py FAILED\n"
    "------------------------------------------------------------\n"
    "Root Cause (first observed failure):\n"
    "[0]:\n"
    "  rank      : 1 (local_rank: 1)\n"
    "  exitcode  : {code} (pid: 20692)\n"
    "  error_file: <N/A>\n"
    "============================================================\n"
)


def metrics_line(step: int, maxent: bool) -> str:
    """The trainer's per-step line, as transformers prints it (values as %.4g strings)."""
    reward = round(0.1 + step / 1000, 4)
    items = {
        "loss": "0.01",
        "grad_norm": "0.5",
        "learning_rate": "1e-06",
        "num_tokens": f"{1028 * step:.4g}",
        "completions/mean_length": "27.5",
        "completions/min_length": "3",
        "completions/max_length": "32",
    }
    for name in _REWARD_FUNCS:
        items[f"rewards/{name}/mean"] = f"{reward:.4g}"
        items[f"rewards/{name}/std"] = "0.1"
    items.update(reward=f"{reward:.4g}", reward_std="0.2", entropy="5.851")
    if maxent:
        items.update({"maxent/weight_entropy": "1.34", "maxent/ess": "3.6", "maxent/beta": "0.05"})
    items.update(step_time="0.55", epoch=f"{step / 1000:.4g}")
    return "{" + ", ".join(f"'{k}': '{v}'" for k, v in items.items()) + "}"


def train_log_text(first: int, last: int, total: int, maxent: bool, resumed: int | None) -> str:
    parts = ["\rMap: 100%|##########| 512/512 [00:00<00:00, 6067.13 examples/s]\n"]
    if resumed is not None:
        parts.append(
            f"12:18:10 INFO [rank0] maxent_grpo: Resuming from outputs/x/checkpoint-{resumed}\n"
        )
    parts.append(f"\r  0%|          | 0/{total} [00:00<?, ?it/s]")
    for step in range(first, last + 1):
        pct = 100 * step // total
        parts.append(f"\r {pct}%|#####     | {step}/{total} [00:01<00:25,  1.33s/it]")
        parts.append(
            "\r                                              \r" + metrics_line(step, maxent)
        )
        parts.append("\n")
    return "".join(parts)


def state_json(steps: int, total: int, maxent: bool) -> str:
    history = []
    for step in range(1, steps + 1):
        entry = {"step": step, "loss": 0.01, "reward": 0.1 + step / 1000, "entropy": 5.85}
        for name in _REWARD_FUNCS:
            entry[f"rewards/{name}/mean"] = 0.1 + step / 1000
        entry["completions/mean_length"] = 27.5
        if maxent:
            entry.update({"maxent/weight_entropy": 1.34, "maxent/ess": 3.6})
        history.append(entry)
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


def make_fake_runs(
    root: Path, count: int = 300, steps: int = 200, big: int = 0, now: float | None = None
) -> dict[str, str]:
    """`count` runs under root/outputs and root/logs; returns {run name: expected state}."""
    now = time.time() if now is None else now
    outputs, logs = root / "outputs", root / "logs"
    outputs.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    expected = {}
    for index in range(count):
        kind = KINDS[index % len(KINDS)]
        maxent = index % 2 == 1
        name = f"run{index:04d}-{kind}"
        out = outputs / name
        out.mkdir()
        job = None if kind in ("stopped", "killed-local") else str(100000 + index)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now - 3600 + index))
        log_name = f"{name}_job{job}_{stamp}_train.log" if job else f"{name}_{stamp}_train.log"
        log = logs / log_name
        size = BIG_LOG_BYTES if index < big else 0
        half = steps // 2
        if kind == "completed":
            text = train_log_text(1, steps, steps, maxent, None)
            text += "12:19:49 INFO [rank0] maxent_grpo: Training complete; model saved to x\n"
            _write(log, text, size)
            _checkpoint(out, half, steps, maxent)
            _checkpoint(out, steps, steps, maxent)
            (out / "trainer_state.json").write_text(state_json(steps, steps, maxent))
            method = "maxent" if maxent else "grpo"
            marker = {"method": method, "global_step": steps, "train_loss": 0.01}
            (out / "maxent_grpo_training_complete.json").write_text(json.dumps(marker))
        elif kind == "running":
            _checkpoint(out, half, steps, maxent)
            _checkpoint(out, half + 10, steps, maxent, complete=False)  # a save in progress
            _write(log, train_log_text(half - 20, half + 15, steps, maxent, half - 20), size)
        elif kind in ("requeued", "stopped"):
            text = train_log_text(1, half, steps, maxent, None)
            text += (
                f"12:16:52 INFO [rank0] maxent_grpo: Stopped on request after step {half}; "
                f"saved outputs/{name}/checkpoint-{half}\n"
            )
            text += _ELASTIC_FAILURE.format(code=85)
            _write(log, text, size, mtime=now - 600)
            _checkpoint(out, half, steps, maxent)
            if kind == "requeued":
                slurm = (
                    text + f"training exited with code 85 after 3600.0s\nlog: logs/{log_name}\n"
                    f"stopped (SIGUSR1 received); resume point: outputs/{name}/checkpoint-{half}\n"
                    f"requeueing {job}\n"
                )
                _write(logs / f"slurm_{job}.out", slurm, mtime=now - 600)
            else:
                (out / "maxent_grpo_stop_requested").write_text('{"reason": "test"}')
        elif kind == "failed":
            text = train_log_text(1, 7, steps, maxent, None)
            text += (
                "[rank1]: Traceback (most recent call last):\n"
                '[rank1]:   File "/repo/src/grpo.py", line 11, in <module>\n'
                "[rank1]:     sys.exit(cli_main(sys.argv[1:]))\n"
                "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
            )
            text += _ELASTIC_FAILURE.format(code=1)
            _write(log, text, size, mtime=now - 7200)
        else:  # killed: no exit line, nothing live, written two hours ago
            _checkpoint(out, half, steps, maxent)
            _write(log, train_log_text(1, half + 3, steps, maxent, None), size, mtime=now - 7200)
        expected[name] = EXPECTED_STATE[kind]
    return expected


def _timed(fn, repeat: int) -> tuple[float, float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times[0], statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=200, help="logged steps per run")
    parser.add_argument("--big", type=int, default=10, help="train logs made 2 GiB (sparse)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from maxent_grpo.runs import collect_runs, format_table

    with tempfile.TemporaryDirectory(prefix="bench-runs-") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        expected = make_fake_runs(root, args.runs, args.steps, args.big)
        made = time.perf_counter() - start
        log_bytes = sum(p.stat().st_size for p in (root / "logs").iterdir())
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
        "runs": args.runs,
        "logged_steps_per_run": args.steps,
        "big_logs": args.big,
        "train_log_bytes_total": log_bytes,
        "collect_and_format_s": {"first": round(first, 4), "median": round(median, 4)},
        "cli_wall_s": {"first": round(cli_first, 4), "median": round(cli_median, 4)},
        "table_lines": lines,
        "wrong_states": wrong,
        "target_s": TARGET_S,
        "generate_s": round(made, 2),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "python": platform.python_version(),
    }
    print(text.splitlines()[0])
    print("\n".join(text.splitlines()[1:4]), "\n...")
    print(
        f"{args.runs} runs ({log_bytes / 1e9:.1f} GB of train logs, {args.big} of 2 GiB): "
        f"collect+format first {first * 1000:.0f} ms, median {median * 1000:.0f} ms; "
        f"`maxent-grpo runs` wall first {cli_first * 1000:.0f} ms, "
        f"median {cli_median * 1000:.0f} ms"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    if wrong:
        print(f"FAIL: wrong states: {wrong}")
        return 1
    if median > TARGET_S:
        print(f"FAIL: {median:.2f}s > target {TARGET_S}s")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
