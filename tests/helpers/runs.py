"""Helpers to run our commands for real in tests (imported as `helpers.runs`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from helpers.paths import PYTHON, REPO

__all__ = ["PYTHON", "REPO", "child_env", "log_history", "run", "step_logs"]


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
