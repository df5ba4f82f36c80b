"""Evaluation jobs on a real Slurm cluster: a CPU smoke run with benchmarks queues one
evaluation job (slurm/eval.sbatch) per saved checkpoint while it trains, their scores reach
`maxent-grpo runs` and `plot`, and a requeue of the training job mid-run queues no evaluation
twice (and scores none twice)."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

from helpers.paths import MAXENT_GRPO, REPO
from helpers.procs import wait_for
from helpers.recipes import write_recipe
from maxent_grpo.rundir import ledger
from maxent_grpo.rundir.events import read_events

BENCHMARKS = [
    {"name": "arithmetic", "num_examples": 8, "max_new_tokens": 16},
    # digit_fraction is what the run trains on: a score that can move as it trains.
    {
        "name": "digits",
        "dataset": "builtin:arithmetic",
        "reward": "digit_fraction",
        "pass_threshold": 0.25,
        "num_examples": 8,
        "num_samples": 4,
        "k": 2,
        "temperature": 1.0,
        "max_new_tokens": 16,
    },
]


STEPS = 30  # checkpoints (and evaluations) at 10, 20, 30


def _events(out: Path, kind: str) -> list[dict]:
    return [e for e in read_events(out) if e["event"] == kind]


def _seconds(runtime: str) -> int:
    days, _, clock = runtime.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def _slurm_out(tmp_path: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(tmp_path.glob("slurm_*.*")))


def test_one_evaluation_job_per_checkpoint_and_none_twice_after_a_requeue(slurm_cluster, tmp_path):
    # One trainer process (what is evaluated does not depend on how many trained it). Steps of
    # 0.5 s or more until the requeue (a reward that sleeps in a fresh start only): the requeue
    # after checkpoint-10's evaluation is queued finds the first attempt mid-run.
    path = write_recipe(
        tmp_path,
        dataset_num_rows=256,
        max_completion_length=16,
        max_steps=STEPS,
        save_steps=10,
        save_total_limit=None,
        num_processes=1,
        reward_funcs=["tests.slurm.fresh_start_rewards:digit_fraction_slow_fresh_start"],
        reward_weights=None,
        benchmarks=BENCHMARKS,
        benchmark_gpus=0,
        benchmark_cpus=1,
        benchmark_time=10,
    )
    out = tmp_path / "out"
    args = ["--cpus-per-task=4", "--export=ALL,FRESH_START_REWARD_S=0.5"]
    args += [f"--output={tmp_path}/slurm_%j.out"]
    args += [f"--error={tmp_path}/slurm_%j.err", "training.sh"]  # not the repository's logs/
    args += ["--config", str(path), "--logs-dir", str(tmp_path / "logs")]
    job = slurm_cluster.submit(args, cwd=REPO)
    try:
        _run_and_check(slurm_cluster, tmp_path, out, job)
    finally:  # only this test's jobs: others may share the cluster
        for submitted in [job, *(e["job"] for e in _events(out, "eval_submit"))]:
            slurm_cluster.cancel(submitted)


def _run_and_check(slurm_cluster, tmp_path: Path, out: Path, job: str) -> None:
    wait_for(lambda: _events(out, "eval_submit"), 300, "the first evaluation job to be queued")
    # A hard requeue mid-run (every process of the job is signalled, then killed): the next
    # attempt resumes from the last complete checkpoint and queues nothing already queued.
    requeued = slurm_cluster.run(["scontrol", "requeue", job])
    assert requeued.returncode == 0, requeued.stderr
    assert slurm_cluster.wait(job, timeout=600) == "COMPLETED", _slurm_out(tmp_path)[-3000:]
    wait_for(lambda: ledger.pending(read_events(out)) == 0, 600, "every evaluation to finish")

    events = list(read_events(out))
    assert len(_events(out, "attempt_start")) >= 2  # it was requeued
    steps = ledger.checkpoint_steps(events)
    assert steps[-1] == STEPS and {10, 20, STEPS} <= set(steps)
    submits = _events(out, "eval_submit")
    assert sorted(e["step"] for e in submits) == steps  # one job per checkpoint, none twice
    jobs = [e["job"] for e in submits]
    assert len(set(jobs)) == len(jobs)
    walls, spans = {}, []
    for submit in submits:
        # Its scores are written before the job ends: wait for its end.
        assert slurm_cluster.wait(submit["job"], timeout=120) == "COMPLETED"
        (record,) = slurm_cluster.job_records(submit["job"])
        assert record["JobName"] == "maxent-grpo-eval-out", record
        walls[submit["step"]] = _seconds(record["RunTime"])
        spans.append((record["StartTime"], record["EndTime"]))
    # --dependency=singleton: one evaluation of the run at a time, in the order queued.
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans
    scores = {(e["benchmark"], e["step"]): e for e in _events(out, "eval")}
    assert len(scores) == len(_events(out, "eval"))  # nothing scored twice
    assert set(scores) == {(b["name"], s) for b in BENCHMARKS for s in steps}
    assert not _events(out, "eval_fail") and not _events(out, "eval_skip")
    assert {e["job"] for e in scores.values()} == set(jobs)

    runs = subprocess.run(
        [MAXENT_GRPO, "runs", "--dir", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    (info,) = json.loads(runs.stdout)
    for name in ("arithmetic", "digits"):
        assert info["evals"][name] == {"step": STEPS, "score": scores[(name, STEPS)]["score"]}
    assert info["evals_queued"] == 0
    png = tmp_path / "plot.png"
    subprocess.run([MAXENT_GRPO, "plot", str(out), "--out", str(png)], check=True, timeout=120)
    rows = list(csv.DictReader(png.with_suffix(".csv").open()))
    plotted = {int(r["step"]): float(r["eval/digits"]) for r in rows if r["eval/digits"]}
    assert plotted == {s: scores[("digits", s)]["score"] for s in steps}

    for step in steps:
        figures = ", ".join(
            f"{b['name']} {scores[(b['name'], step)]['score']:.4f}" for b in BENCHMARKS
        )
        slurm_cluster.timings[f"eval job step {step} wall (s) [{figures}]"] = walls[step]
