"""training.sh and the submitit launcher on a real Slurm cluster (fake GPUs, CPU training).

Slurm gives the jobs CUDA_VISIBLE_DEVICES for its fake GPUs (symlinks to /dev/null); the smoke
recipe says use_cpu, so the launcher plans CPU training regardless. Everything else is real:
sbatch, the time-limit signal, scontrol requeue, array tasks, submitit's requeue.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "recipes" / "smoke" / "config_grpo.yaml"
MAXENT_GRPO = str(Path(sys.executable).parent / "maxent-grpo")


def recipe(tmp_path: Path, name: str = "recipe.yaml", **overrides) -> Path:
    data = yaml.safe_load(SMOKE.read_text())
    data.update(
        output_dir=str(tmp_path / "out"),
        dataset_num_rows=256,
        max_completion_length=16,
        max_steps=12,
        save_steps=1000,
    )
    data.update(overrides)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def sbatch_training(cluster, tmp_path: Path, recipe_path: Path, *sbatch_args: str) -> str:
    """`sbatch training.sh` from the repository, with output and logs under tmp_path."""
    args = [
        *sbatch_args,
        f"--output={tmp_path}/slurm_%j.out",
        "training.sh",
        "--config",
        str(recipe_path),
        "--logs-dir",
        str(tmp_path / "logs"),
    ]
    return cluster.submit(args, cwd=REPO)


def slurm_out(tmp_path: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(tmp_path.glob("slurm_*.out")))


def train_logs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "logs").glob("*_train.log"))


def weights(path: Path) -> dict:
    return load_file(str(path / "model.safetensors"))


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def local_reference_run(tmp_path: Path, **overrides) -> Path:
    """The same recipe run without Slurm, uninterrupted: the result to compare against."""
    folder = tmp_path / "reference"
    folder.mkdir()
    path = recipe(folder, **overrides)
    result = subprocess.run(
        [MAXENT_GRPO, "run", "--config", str(path), "--logs-dir", str(folder / "logs")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return folder / "out"


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert (wa[key] - wb[key]).abs().max().item() <= 1e-6, key


def test_sbatch_training_sh_runs_smoke_recipe_to_completion(slurm_cluster, tmp_path):
    job = sbatch_training(slurm_cluster, tmp_path, recipe(tmp_path))
    assert slurm_cluster.wait(job, timeout=300) == "COMPLETED", slurm_out(tmp_path)
    out = slurm_out(tmp_path)
    assert "training: 2 processes on 1 machine(s)" in out  # CPU plan despite fake GPUs
    assert f"model: {tmp_path / 'out'}" in out
    assert (tmp_path / "out" / "maxent_grpo_training_complete.json").is_file()
    (log,) = train_logs(tmp_path)
    assert f"job{job}" in log.name


def test_time_limit_signal_checkpoints_requeues_and_resumes_exactly(slurm_cluster, tmp_path):
    # Long enough that the time-limit signal (15-45 s after start) lands mid-training.
    steps = 400
    path = recipe(tmp_path, max_steps=steps)
    job = sbatch_training(
        slurm_cluster, tmp_path, path, "--time=1", "--signal=B:USR1@45", "--requeue"
    )
    wait_for(lambda: "requeueing " in slurm_out(tmp_path), 150, "the first attempt to requeue")
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

    reference = local_reference_run(tmp_path, max_steps=steps)
    assert_same_weights(tmp_path / "out", reference)


def test_array_retry_resumes_after_hard_kill_and_later_tasks_exit_at_once(slurm_cluster, tmp_path):
    steps = 400
    path = recipe(tmp_path, max_steps=steps, save_steps=20)
    job = sbatch_training(slurm_cluster, tmp_path, path, "--array=0-2%1")
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
    path = recipe(tmp_path, num_generation=4)  # typo: unknown key
    job = sbatch_training(slurm_cluster, tmp_path, path, "--array=0-2%1")
    for task in range(3):
        assert slurm_cluster.wait(f"{job}_{task}", timeout=180) == "FAILED"
    errors = [line for line in slurm_out(tmp_path).splitlines() if line.startswith("error:")]
    assert len(errors) == 3 and len(set(errors)) == 1, errors
    assert "unknown key 'num_generation'" in errors[0]


def test_bad_recipe_is_rejected_before_queueing(slurm_cluster, tmp_path):
    path = recipe(tmp_path, num_generations=3)  # 4 per device x 2 processes: not divisible
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
        assert line.startswith("error: ") and "num_generations (3)" in line, line
    assert slurm_cluster.run(["squeue", "-h", "-o", "%i"]).stdout == before


def test_submitit_preempted_job_requeues_resumes_and_completes(slurm_cluster, tmp_path):
    steps = 400
    path = recipe(tmp_path, max_steps=steps)
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
        env={**slurm_cluster.env, "OMP_NUM_THREADS": "1"},
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
    # What Slurm does before a time limit (and on preemption): USR2 to the job's processes.
    slurm_cluster.run(["scancel", "--signal=USR2", job])
    assert slurm_cluster.wait(job, timeout=600) == "COMPLETED"

    logs = train_logs(tmp_path)
    assert len(logs) == 2, logs
    assert "Stopped on request after step" in logs[0].read_text()
    assert "Resuming from" in logs[1].read_text()
    assert (tmp_path / "out" / "maxent_grpo_training_complete.json").is_file()
    assert_same_weights(tmp_path / "out", local_reference_run(tmp_path, max_steps=steps))


@pytest.fixture(autouse=True)
def _no_leftover_jobs(slurm_cluster):
    yield
    # A failed test must not leave jobs that block the (single) node for the next one.
    jobs = slurm_cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split()
    for job in jobs:
        slurm_cluster.cancel(job)
