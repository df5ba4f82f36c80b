"""Rollout filters, rounds and carry-over in real (tiny, CPU) MaxEnt-GRPO runs.

Integration: three short runs of the tiny model in subprocesses (about 45 s in all).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers.paths import REPO, SMOKE_MAXENT
from helpers.recipes import small_recipe
from helpers.resume import assert_resumed_from, event_count
from maxent_grpo.rundir.checkpoints import RUN_MARKER, last_complete_checkpoint
from maxent_grpo.rundir.events import read_events
from maxent_grpo.tiny_model import build_tiny_model

ENTRY = REPO / "src" / "maxent-grpo.py"
# nonzero_std on the MaxEnt smoke rewards drops most groups of the untrained model; with 3x
# oversampling, step 5 (seed 42) keeps a surplus group, carried into step 6, which generates
# nothing. The run stops at the checkpoint of step 5.
ROLLOUTS = {
    "rollout_filters": ["nonzero_std"],
    "max_generation_rounds": 3,
    "oversample_factor": 3.0,
    "max_completion_length": 32,
    "max_steps": 7,
    "save_steps": 5,
    "save_total_limit": None,
}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen2")


def train(recipe: Path, *flags: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, str(ENTRY), "--config", str(recipe), *flags]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def step_metrics(output_dir: Path) -> dict[int, dict]:
    return {
        int(e["step"]): e["metrics"]
        for e in read_events(output_dir)
        if e["event"] == "step" and "rollouts/rounds" in e.get("metrics", {})
    }


@pytest.mark.integration
def test_resume_with_carried_groups_matches_an_uninterrupted_run(tiny_model, tmp_path):
    full_recipe = small_recipe(tmp_path / "full", tiny_model, SMOKE_MAXENT, **ROLLOUTS)
    part_recipe = small_recipe(tmp_path / "part", tiny_model, SMOKE_MAXENT, **ROLLOUTS)
    full, part = tmp_path / "full" / "out", tmp_path / "part" / "out"
    train(full_recipe)
    train(part_recipe, "--max_steps", "5")
    assert last_complete_checkpoint(part) == part / "checkpoint-5"
    (part / RUN_MARKER).unlink()  # as if the job had been stopped right after the checkpoint
    saved = torch.load(part / "checkpoint-5" / "rollout_state-0.pt", weights_only=True)
    assert saved["carried"], "the test needs groups carried over at the checkpoint"
    assert saved["reserve_position"] > 0

    before = event_count(part)
    log = train(part_recipe)
    assert_resumed_from(part, before, checkpoint=5, max_steps=7, log=log)
    carried = len(saved["carried"])
    assert f"rollouts: resumed {carried} carried groups" in log

    expected, resumed = step_metrics(full), step_metrics(part)
    for step in (6, 7):
        a = {k: v for k, v in expected[step].items() if "time" not in k}
        b = {k: v for k, v in resumed[step].items() if "time" not in k}
        assert a == b, f"step {step} differs after resume"
    # Step 6 trained on the carried group alone, in both runs: a resume that ignored the
    # state file would have generated at step 6 (carried_in 0).
    assert resumed[6]["rollouts/carried_in"] == carried
    assert resumed[6]["rollouts/groups_generated"] == 0.0
    # Every trained step had reward spread in each group it trained on.
    for metrics in expected.values():
        if not metrics["rollouts/skipped"]:
            assert metrics["frac_reward_zero_std"] == 0.0
    weights_full = load_file(full / "model.safetensors")
    weights_part = load_file(part / "model.safetensors")
    assert weights_full.keys() == weights_part.keys()
    for name, tensor in weights_full.items():
        assert torch.equal(tensor, weights_part[name]), name
