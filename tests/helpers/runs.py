"""Helpers to run our commands for real in tests (imported as `helpers.runs`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from helpers.paths import MAXENT_GRPO, PYTHON, REPO

__all__ = [
    "PYTHON",
    "REPO",
    "child_env",
    "log_history",
    "run",
    "sbatch_chain",
    "slurm_logs",
    "step_logs",
]


def child_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: one OpenMP thread, no hub, no W&B."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    # A wandb service started in the test process (wandb keeps its token in os.environ) must
    # not be shared by the children: each real run starts its own.
    env.pop("WANDB_SERVICE", None)
    env.update(extra)
    return env


def run(
    args: list[str], cwd: Path = REPO, timeout: float = 600, **env
) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, cwd=cwd, env=child_env(**env), capture_output=True, text=True, timeout=timeout
    )


def log_history(output_dir: Path) -> list[dict]:
    return json.loads((Path(output_dir) / "trainer_state.json").read_text())["log_history"]


def step_logs(output_dir: Path) -> dict[int, dict]:
    """Per-step training logs (the entries that carry a loss), keyed by step."""
    return {e["step"]: e for e in log_history(output_dir) if "loss" in e}


def sbatch_chain(cluster, folder: Path, first: Path, second: Path) -> tuple[dict, list[str]]:
    """`maxent-grpo sbatch --config first --chain second` on the test cluster (1 GPU, 2 CPUs,
    2G, 10 min each; Slurm's logs in folder): the environment it used and the two job ids."""
    env = {**cluster.env, "SBATCH_OUTPUT": f"{folder}/slurm_%j.out"}
    env["SBATCH_ERROR"] = f"{folder}/slurm_%j.err"
    command = [MAXENT_GRPO, "sbatch", "--config", str(first), "--chain", str(second)]
    command += ["--gpus", "1", "--cpus-per-task", "2", "--mem", "2G", "--time", "10"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = [line.split()[2].rstrip(":") for line in result.stdout.splitlines()]
    assert len(jobs) == 2, result.stdout
    return env, jobs


def slurm_logs(folder: Path) -> str:
    """The Slurm job logs that sbatch_chain's jobs wrote into folder, for a failure message."""
    return "\n".join(p.read_text() for p in sorted(folder.glob("slurm_*")))
