"""training.sh and the submitit launcher on a real Slurm cluster (fake GPUs, CPU training).

Slurm gives the jobs CUDA_VISIBLE_DEVICES for its fake GPUs (symlinks to /dev/null); the smoke
recipe says use_cpu, so the launcher plans CPU training regardless. Everything else is real:
sbatch, the time-limit signal, scontrol requeue, array tasks, submitit's requeue.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers.paths import MAXENT_GRPO, REPO
from helpers.procs import wait_for
from helpers.recipes import ONE_THREAD, small_recipe

# One thread per trainer; the completion length the signal timings below were sized with.
KEYS = {**ONE_THREAD, "max_completion_length": 16}


def sbatch_training(cluster, tmp_path: Path, recipe_path: Path, *sbatch_args: str) -> str:
    """`sbatch training.sh` from the repository, with output and logs under tmp_path."""
    args = [
        *sbatch_args,
        f"--output={tmp_path}/slurm_%j.out",
        f"--error={tmp_path}/slurm_%j.err",  # training.sh's own: logs/ of the repository
        "training.sh",
        "--config",
        str(recipe_path),
        "--logs-dir",
        str(tmp_path / "logs"),
    ]
    return cluster.submit(args, cwd=REPO)


def slurm_out(tmp_path: Path) -> str:
    """What the jobs wrote: every slurm_<job>.out, then every .err."""
    files = [*sorted(tmp_path.glob("slurm_*.out")), *sorted(tmp_path.glob("slurm_*.err"))]
    # errors="replace": nodes of a multi-node job write one file, a character may be cut.
    return "\n".join(p.read_text(errors="replace") for p in files)


def train_logs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "logs").glob("*_train.log"))


def weights(path: Path) -> dict:
    return load_file(str(path / "model.safetensors"))


# A reward that sleeps only in an attempt that started from step 0 (FRESH_START_REWARD_S, given
# to the job alone): the first attempt idles while Slurm's signal, grace time or kill comes, the
# resumed one trains at full speed. The requeue tests share these keys, so one reference serves.
FRESH = dict(
    reward_funcs=["tests.slurm.fresh_start_rewards:digit_fraction_slow_fresh_start"],
    reward_weights=None,
)
RESUME_STEPS = 100
_REFERENCES: dict[str, Path] = {}


def local_reference_run(tmp_path: Path, **overrides) -> Path:
    """The same recipe run without Slurm, uninterrupted: the result to compare against. Run
    once per set of keys in a session (the tests that compare with it share it)."""
    key = repr(sorted(overrides.items()))
    if key in _REFERENCES:
        return _REFERENCES[key]
    folder = tmp_path / "reference"
    folder.mkdir()
    path = small_recipe(folder, **KEYS, **overrides)
    result = subprocess.run(
        [MAXENT_GRPO, "run", "--config", str(path), "--logs-dir", str(folder / "logs")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    _REFERENCES[key] = folder / "out"
    return folder / "out"


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert (wa[key] - wb[key]).abs().max().item() <= 1e-6, key


def test_sbatch_training_sh_runs_smoke_recipe_to_completion(slurm_cluster, tmp_path):
    job = sbatch_training(slurm_cluster, tmp_path, small_recipe(tmp_path, **KEYS, max_steps=12))
    assert slurm_cluster.wait(job, timeout=300) == "COMPLETED", slurm_out(tmp_path)
    out = slurm_out(tmp_path)
    assert "training: 2 processes on 1 machine(s)" in out  # CPU plan despite fake GPUs
    assert f"model: {tmp_path / 'out'}" in out
    assert (tmp_path / "out" / "maxent_grpo_training_complete.json").is_file()
    (log,) = train_logs(tmp_path)
    assert f"job{job}" in log.name


def elapsed_s(record: dict[str, str]) -> int:
    """A job's RunTime ([D-]HH:MM:SS) in seconds."""
    days, _, clock = record["RunTime"].rpartition("-")
    hours, minutes, seconds = (int(x) for x in clock.split(":"))
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


def test_time_limit_signal_checkpoints_requeues_and_resumes_exactly(slurm_cluster, tmp_path):
    # The first attempt's steps take 1 s or more (it sleeps): 100 steps outlast the signal's
    # wait below (at most 50 s) whatever the load; the resumed attempt trains the rest at once.
    steps = RESUME_STEPS
    path = small_recipe(tmp_path, **KEYS, **FRESH, max_steps=steps)
    job = sbatch_training(
        slurm_cluster,
        tmp_path,
        path,
        *("--time=10", "--signal=B:USR1@100", "--requeue"),
        "--export=ALL,FRESH_START_REWARD_S=1",
    )
    # Slurm sends the signal at the first 30 s tick at which the time left is at most 100 + 30 s,
    # so a short limit from the start could signal the job before training starts. Shorten the
    # limit once training runs: 60-120 s left, so the signal comes within 30 s, mid-training,
    # with at least 30 s to checkpoint and requeue.
    wait_for(
        lambda: "'loss'" in "".join(p.read_text() for p in train_logs(tmp_path)), 240, "training"
    )
    (record,) = slurm_cluster.job_records(job)
    minutes = elapsed_s(record) // 60 + 2
    update = slurm_cluster.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}"])
    assert update.returncode == 0, update.stderr
    wait_for(lambda: "requeueing " in slurm_out(tmp_path), 60, "the first attempt to requeue")
    # Give the second attempt room to finish (the first one proved the signal path).
    slurm_cluster.run(["scontrol", "update", f"JobId={job}", "TimeLimit=15"])
    assert slurm_cluster.wait(job, timeout=600) == "COMPLETED", slurm_out(tmp_path)

    logs = train_logs(tmp_path)
    assert len(logs) == 2, logs
    first, second = logs[0].read_text(), logs[1].read_text()
    stopped = re.search(r"Stopped on request after step (\d+); saved (\S+)", first)
    assert stopped, first[-3000:]
    step = int(stopped.group(1))
    assert 0 < step < steps
    # No completed step is lost: the checkpoint is the last step done, and training resumes
    # right after it.
    assert stopped.group(2).endswith(f"checkpoint-{step}")
    assert f"Resuming from {stopped.group(2)}" in second

    # Nothing of either attempt is left running (zombies aside).
    left = [
        line
        for line in subprocess.run(
            ["ps", "-eo", "stat=,args="], capture_output=True, text=True
        ).stdout.splitlines()
        if str(path) in line and not line.lstrip().startswith("Z")
    ]
    assert not left, left

    reference = local_reference_run(tmp_path, **FRESH, max_steps=steps)
    assert_same_weights(tmp_path / "out", reference)


def test_a_scancel_ends_the_job_and_keeps_the_step_it_was_in(slurm_cluster, tmp_path):
    """`scancel JOB` (Slurm marks the job CANCELLED, then signals it): the trainers save the
    step they are in within KillWait, and the job ends CANCELLED, not requeued behind the user
    (the chaos campaign's finding, docs/reliability.md: it was requeued and trained on)."""
    path = small_recipe(tmp_path, **KEYS, **FRESH, max_steps=RESUME_STEPS)
    job = sbatch_training(
        slurm_cluster, tmp_path, path, "--requeue", "--export=ALL,FRESH_START_REWARD_S=1"
    )
    wait_for(
        lambda: "'loss'" in "".join(p.read_text() for p in train_logs(tmp_path)), 240, "training"
    )
    slurm_cluster.run(["scancel", job])
    assert slurm_cluster.wait(job, timeout=300) == "CANCELLED", slurm_out(tmp_path)
    out = slurm_out(tmp_path)
    assert "not requeued: Slurm ended the job" in out and "requeueing " not in out, out
    (record,) = slurm_cluster.job_records(job)
    assert record["Restarts"] == "0", record
    (log,) = train_logs(tmp_path)
    stopped = re.search(r"Stopped on request after step (\d+); saved (\S+)", log.read_text())
    assert stopped and Path(stopped.group(2)).is_dir(), log.read_text()[-3000:]


def test_array_retry_resumes_after_hard_kill_and_later_tasks_exit_at_once(slurm_cluster, tmp_path):
    # The kill comes within a poll (0.5 s) of checkpoint-20: 20 more steps of 1 s or more (the
    # first task sleeps in each) keep it mid-training; the second trains them after its resume.
    steps = 40
    path = small_recipe(tmp_path, **KEYS, **FRESH, max_steps=steps, save_steps=20)
    job = sbatch_training(
        slurm_cluster, tmp_path, path, "--array=0-2%1", "--export=ALL,FRESH_START_REWARD_S=1"
    )
    out_dir = tmp_path / "out"
    wait_for(
        lambda: list(out_dir.glob("checkpoint-*/maxent_grpo_complete.json")),
        240,
        "a complete checkpoint in the first task",
    )
    slurm_cluster.run(["scancel", "--signal=KILL", "--full", f"{job}_0"])
    assert slurm_cluster.wait(f"{job}_1", timeout=600) == "COMPLETED", slurm_out(tmp_path)
    started = time.monotonic()
    assert slurm_cluster.wait(f"{job}_2", timeout=120) == "COMPLETED"
    assert time.monotonic() - started < 60

    out = slurm_out(tmp_path)
    assert "Resuming from" in "".join(p.read_text() for p in train_logs(tmp_path))
    assert "already holds a completed run; nothing to do." in out
    assert (out_dir / "maxent_grpo_training_complete.json").is_file()


def test_bad_recipe_in_an_array_does_not_burn_retries(slurm_cluster, tmp_path):
    path = small_recipe(tmp_path, **KEYS, num_generation=4)  # typo: unknown key
    job = sbatch_training(slurm_cluster, tmp_path, path, "--array=0-2%1")
    for task in range(3):
        assert slurm_cluster.wait(f"{job}_{task}", timeout=180) == "FAILED"
    errors = [line for line in slurm_out(tmp_path).splitlines() if line.startswith("error:")]
    assert len(errors) == 3 and len(set(errors)) == 1, errors
    assert "unknown key 'num_generation'" in errors[0]


@pytest.mark.parametrize(
    "bad, named",
    [
        (dict(num_generations=3), "num_generations (3)"),  # 8 x 2 processes: not divisible
        # A reward is the trainers' check inside the allocation: sbatch/submit run it first.
        (dict(reward_funcs=["no_such_reward"], reward_weights=None), "no_such_reward"),
    ],
)
def test_bad_recipe_is_rejected_before_queueing(slurm_cluster, tmp_path, bad, named):
    path = small_recipe(tmp_path, **KEYS, **bad)
    before = slurm_cluster.run(["squeue", "-h", "-o", "%i"]).stdout
    for command in ("sbatch", "submit"):
        result = subprocess.run(
            [MAXENT_GRPO, command, "--config", str(path), "--gpus", "8"],
            cwd=REPO,
            env=slurm_cluster.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("error: ") and named in line, line
    assert slurm_cluster.run(["squeue", "-h", "-o", "%i"]).stdout == before


def test_submitit_preempted_job_requeues_resumes_and_completes(slurm_cluster, tmp_path):
    # The signal goes out once step 1 is logged and reaches the trainers within a second or
    # two; 100 steps (15-30 s here) keep it mid-training. The reference run (shared with the
    # time-limit test: the same keys) repeats them all.
    steps = RESUME_STEPS
    path = small_recipe(tmp_path, **KEYS, **FRESH, max_steps=steps)
    result = subprocess.run(
        [
            MAXENT_GRPO,
            "submit",
            "--config",
            str(path),
            "--gpus",
            "0",
            "--cpus-per-task",
            "2",
            "--folder",
            str(tmp_path / "submitit"),
            "--logs-dir",
            str(tmp_path / "logs"),
        ],
        cwd=REPO,
        # Steps of 0.5 s or more in the first attempt: the signal finds it mid-training.
        env={**slurm_cluster.env, "OMP_NUM_THREADS": "1", "FRESH_START_REWARD_S": "0.5"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    job = re.search(r"submitted job (\d+)", result.stdout).group(1)
    wait_for(
        lambda: any("'loss'" in p.read_text() for p in train_logs(tmp_path)),
        240,
        "training to start",
    )
    # What Slurm does before the time limit (submit asks for --signal=B:USR2@...): USR2 to the
    # batch shell only.
    signalled = slurm_cluster.run(["scancel", "--batch", "--signal=USR2", job])
    assert signalled.returncode == 0, signalled.stderr
    assert slurm_cluster.wait(job, timeout=600) == "COMPLETED"

    logs = train_logs(tmp_path)
    assert len(logs) == 2, logs
    assert "Stopped on request after step" in logs[0].read_text()
    assert "Resuming from" in logs[1].read_text()
    assert (tmp_path / "out" / "maxent_grpo_training_complete.json").is_file()
    assert_same_weights(tmp_path / "out", local_reference_run(tmp_path, **FRESH, max_steps=steps))


@pytest.fixture(autouse=True)
def _no_leftover_jobs(slurm_cluster):
    yield
    # A failed test must not leave jobs that block the (single) node for the next one.
    jobs = slurm_cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split()
    for job in jobs:
        slurm_cluster.cancel(job)
