"""Real TRL training on the tiny model (CPU): the smoke launch, learning, resume, CLI errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from helpers.paths import MAXENT_GRPO, PYTHON, REPO, SMOKE
from helpers.recipes import small_recipe
from helpers.resume import assert_resumed_from, event_count
from helpers.runs import run, step_logs
from maxent_grpo.rundir.checkpoints import (
    CHECKPOINT_MARKER,
    last_complete_checkpoint,
    run_is_complete,
)

GRPO = str(REPO / "src" / "grpo.py")


def test_grpo_cli_rejects_unknown_key_in_one_line():
    result = run([PYTHON, GRPO, "--config", str(SMOKE), "--no_such_key", "1"], timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: command line: unknown flag '--no_such_key'; "
        "see the recipe key reference in the docs"
    ]
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.integration
def test_launcher_runs_smoke_recipe_on_two_cpu_processes(tmp_path, tiny_model):
    recipe = small_recipe(tmp_path, tiny_model, save_steps=2)
    logs = tmp_path / "logs"
    result = run(
        [MAXENT_GRPO, "run", "--config", str(recipe), "--logs-dir", str(logs)], timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = tmp_path / "out"
    assert "training: 2 processes on 1 machine(s)" in result.stdout
    assert f"model: {out}" in result.stdout
    assert run_is_complete(out)
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    # Both checkpoints complete; the final state has every step.
    assert last_complete_checkpoint(out) == out / "checkpoint-4"
    assert sorted(step_logs(out)) == [1, 2, 3, 4]
    (log,) = logs.glob("out_*_train.log")
    assert "Training complete" in log.read_text()
    # DDP is not asked to search for unused parameters (every one is used): no warning per rank.
    assert "find_unused_parameters=True" not in log.read_text() + result.stderr

    # A second start on a completed run does nothing and says so.
    again = run([MAXENT_GRPO, "run", "--config", str(recipe), "--logs-dir", str(logs)])
    assert again.returncode == 0 and "already holds a completed run" in again.stdout


@pytest.mark.integration
def test_grpo_learns_a_climbable_reward(tmp_path, tiny_model):
    # A dense reward the random tiny model can climb: proves the update has the right sign.
    recipe = small_recipe(
        tmp_path,
        tiny_model,
        reward_funcs=["digit_fraction"],
        reward_weights=None,
        max_completion_length=16,
        num_generations=8,
        per_device_train_batch_size=16,
        learning_rate=3.0e-3,
        max_steps=30,
        save_strategy="no",
        seed=0,
    )
    result = run([PYTHON, GRPO, "--config", str(recipe)], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rewards = [float(log["reward"]) for _, log in sorted(step_logs(tmp_path / "out").items())]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"mean reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    assert last > first + 0.1


@pytest.mark.integration
def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path, tiny_model):
    # 2 prompts, 1 per step: epochs of 2 steps, so the resume at step 3 lands in the second
    # epoch, whose prompt order TRL's sampler alone would not reproduce (train/data_order.py).
    def train(name: str, max_steps: int) -> tuple[Path, str]:
        folder = tmp_path / name
        folder.mkdir(exist_ok=True)
        recipe = small_recipe(
            folder, tiny_model, max_steps=max_steps, save_steps=3, dataset_num_rows=2
        )
        result = run([PYTHON, GRPO, "--config", str(recipe), "--max_steps", str(max_steps)])
        assert result.returncode == 0, result.stderr[-3000:]
        return folder / "out", result.stdout + result.stderr

    def copy_of_part(name: str) -> Path:
        """The stopped run's output folder, copied for a resume from a tampered checkpoint."""
        out = tmp_path / name / "out"
        shutil.copytree(part, out)
        return out

    full, _ = train("full", 6)
    # Stop after step 3 (its checkpoint is complete), then start again with the full length.
    part, _ = train("part", 3)
    (part / "maxent_grpo_training_complete.json").unlink()
    assert (part / "checkpoint-3" / CHECKPOINT_MARKER).is_file()
    rng, moments = copy_of_part("rng"), copy_of_part("moments")
    before = event_count(part)
    resumed, log = train("part", 6)
    assert resumed == part
    # It resumed: only steps 4-6 ran, from checkpoint-3 (a fresh start would log 1-6 again).
    assert_resumed_from(part, before, checkpoint=3, max_steps=6, log=log)

    full_logs, resumed_logs = step_logs(full), step_logs(part)
    assert sorted(resumed_logs) == [1, 2, 3, 4, 5, 6]
    for step in (4, 5, 6):
        for key in LOGGED:
            assert float(resumed_logs[step][key]) == pytest.approx(
                float(full_logs[step][key]), rel=1e-5, abs=1e-7
            ), (step, key)

    # What exists only in the checkpoint is loaded: another RNG state there changes the
    # completions sampled at step 4; other Adam moments change the update of step 4, so
    # what step 5 logs (its weights), while step 4's own numbers stay.
    states = torch.load(rng / "checkpoint-3" / "rng_state.pth", weights_only=False)
    states["cpu"] = torch.Generator().manual_seed(12345).get_state()
    torch.save(states, rng / "checkpoint-3" / "rng_state.pth")
    optimizer = torch.load(moments / "checkpoint-3" / "optimizer.pt", weights_only=False)
    for state in optimizer["state"].values():
        state["exp_avg"] = -state["exp_avg"]  # the momentum now pulls the other way
    torch.save(optimizer, moments / "checkpoint-3" / "optimizer.pt")
    for name in ("rng", "moments"):
        before = event_count(tmp_path / name / "out")
        train(name, 6)
        assert_resumed_from(tmp_path / name / "out", before, checkpoint=3, max_steps=6)
    changed_by_rng = differing(step_logs(rng), resumed_logs, 4)
    assert changed_by_rng, "another RNG state in checkpoint-3 changed nothing at step 4"
    assert not differing(step_logs(moments), resumed_logs, 4)
    assert differing(step_logs(moments), resumed_logs, 5), "other Adam moments changed nothing"


LOGGED = ("loss", "reward", "grad_norm", "completions/mean_length")


def differing(logs: dict, reference: dict, step: int) -> list[str]:
    """The LOGGED values of `step` that differ between two runs' logs."""
    return [
        key
        for key in LOGGED
        if float(logs[step][key]) != pytest.approx(float(reference[step][key]), rel=1e-5, abs=1e-7)
    ]


def test_module_entry_point_takes_the_method_and_rejects_bad_keys_in_one_line():
    for method in ("grpo", "maxent"):
        result = run(
            [PYTHON, "-m", "maxent_grpo.train", "--method", method, "--config", str(SMOKE)]
            + ["--no_such_key", "1"],
            timeout=120,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [
            "error: command line: unknown flag '--no_such_key'; "
            "see the recipe key reference in the docs"
        ]
