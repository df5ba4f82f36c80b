"""Adaptive KL for GRPO (train/adaptive_kl.py): real CPU runs of src/grpo.py on the tiny model.

beta must follow MaxEnt's KLController step by step, fed with the KL TRL logs, and a resumed run
must continue from the controller state saved in the checkpoint (tests/test_state_registry.py,
with 2 processes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.recipes import write_recipe
from helpers.runs import REPO, child_env
from maxent_grpo.rundir.checkpoints import last_complete_checkpoint
from maxent_grpo.train.adaptive_kl import KLController
from maxent_grpo.train.state import STATE_FILE

GRPO = REPO / "src" / "grpo.py"
INIT_BETA, TARGET = 0.05, 0.002
COMPLETIONS_PER_STEP = 4 * 2  # per_device_train_batch_size x gradient_accumulation_steps x 1
HORIZON = COMPLETIONS_PER_STEP  # the smallest allowed: beta moves up to 20% a step


def adaptive_recipe(folder: Path, tiny_model: Path, **changes) -> Path:
    keys = dict(
        model_name_or_path=str(tiny_model),
        dataset_num_rows=256,
        reward_funcs=["digit_fraction"],
        reward_weights=None,
        num_generations=4,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_completion_length=16,
        learning_rate=1.0e-2,  # large: the policy leaves the reference within a few steps
        init_kl_coeff=INIT_BETA,
        kl_target=TARGET,
        kl_horizon=HORIZON,
        max_steps=6,
        save_steps=3,
        save_total_limit=None,
    )
    return write_recipe(folder, **{**keys, **changes})


def train(recipe: Path, *flags: str) -> str:
    """One run of src/grpo.py; its output."""
    cmd = [sys.executable, str(GRPO), "--config", str(recipe), *flags]
    proc = subprocess.run(
        cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def step_logs(output_dir: Path) -> dict[int, dict]:
    state = json.loads((last_complete_checkpoint(output_dir) / "trainer_state.json").read_text())
    return {e["step"]: e for e in state["log_history"] if "loss" in e}


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, tiny_model) -> Path:
    """The adaptive recipe's 6 steps, uninterrupted (read by the tests below, never changed)."""
    folder = tmp_path_factory.mktemp("full")
    train(adaptive_recipe(folder, tiny_model))
    return folder / "out"


@pytest.mark.integration
def test_grpo_beta_follows_the_kl_controller(full_run):
    out = full_run
    logs = step_logs(out)
    assert sorted(logs) == [1, 2, 3, 4, 5, 6]

    replay = KLController(INIT_BETA, TARGET, HORIZON)
    for step in sorted(logs):
        print(f"step {step}: kl {logs[step]['kl']:.5f}, beta {logs[step]['beta']:.5f}")
        # the beta this step's loss used: the controller after the steps before it
        assert logs[step]["beta"] == pytest.approx(replay.beta, rel=1e-9)
        replay.update(logs[step]["kl"], COMPLETIONS_PER_STEP)
    betas = [logs[s]["beta"] for s in sorted(logs)]
    # step 1: the policy is the reference (KL 0), so beta drops by the clipped 20%
    assert betas[1] == pytest.approx(INIT_BETA * 0.8, rel=1e-9)
    assert len(set(betas)) >= 4, betas  # it moves every step
    saved = torch.load(out / "checkpoint-6" / STATE_FILE.format(0), weights_only=True)
    assert saved["pieces"]["kl_controller"]["beta"] == pytest.approx(replay.beta, rel=1e-9)


@pytest.mark.integration
def test_without_kl_target_beta_stays_and_nothing_is_saved(tmp_path, tiny_model):
    out = tmp_path / "out"
    train(adaptive_recipe(tmp_path, tiny_model, kl_target=None, kl_horizon=None, max_steps=3))
    logs = step_logs(out)
    assert all("beta" not in logs[s] and "kl" in logs[s] for s in logs)
    assert not (out / "checkpoint-3" / STATE_FILE.format(0)).exists()
