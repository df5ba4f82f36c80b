"""Every attempt's end has a class (launch/outcomes.py), produced here for real through the
launcher with 2 CPU training processes: out of memory, a crash, and the same crash twice.

The out-of-memory case raises torch.OutOfMemoryError (the exception a failed CUDA allocation
raises) from a failpoint: the real exception class, on a machine without a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.launched import MAXENT_GRPO, Launched, outcomes
from helpers.recipes import small_recipe
from helpers.runs import run

pytestmark = pytest.mark.integration


def runs_table(tmp_path: Path) -> str:
    result = run(
        [MAXENT_GRPO, "runs", "--dir", str(tmp_path / "out"), "--dir", str(tmp_path / "logs")]
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_out_of_memory_is_permanent_and_says_what_to_lower(tmp_path, tiny_model):
    launched = Launched(
        tmp_path,
        small_recipe(tmp_path, tiny_model, max_steps=20, save_steps=2),
        MAXENT_GRPO_FAILPOINT="step_begin:3:oom",
    )
    assert launched.wait(timeout=300) == 2, launched.text[-3000:]
    (outcome,) = outcomes(tmp_path / "out")
    assert outcome["outcome"] == "oom" and outcome["step"] == 2, outcome
    assert "OutOfMemoryError" in outcome["reason"]
    assert "per_device_train_batch_size" in outcome["reason"]
    assert "gradient_checkpointing" in outcome["reason"]
    assert "not retried: oom is permanent" in launched.text
    table = runs_table(tmp_path)
    assert "oom: out of memory (rank" in table, table


def test_a_crash_is_retried_once_and_the_same_crash_twice_is_permanent(tmp_path, tiny_model):
    path = small_recipe(tmp_path, tiny_model, max_steps=20, save_steps=2)
    first = Launched(tmp_path, path, MAXENT_GRPO_FAILPOINT="step_begin:3:error")
    assert first.wait(timeout=300) == 1, first.text[-3000:]
    (crash,) = outcomes(tmp_path / "out")
    assert crash["outcome"] == "crash" and crash["code"] == 1
    assert "RuntimeError: failpoint step_begin at step 3" in crash["reason"]
    assert "not requeued: not running under Slurm" in first.text  # transient: run it again

    # Resumed from checkpoint-2, the same error at the same point: permanent now.
    second = Launched(tmp_path, path, MAXENT_GRPO_FAILPOINT="step_begin:3:error")
    assert second.wait(timeout=300) == 2, second.text[-3000:]
    again = outcomes(tmp_path / "out")[-1]
    assert again["outcome"] == "crash" and again["code"] == 2
    assert again["reason"].startswith("the same error twice: rank")
    assert "not retried: crash is permanent" in second.text
    table = runs_table(tmp_path)
    line = next(line for line in table.splitlines() if line.startswith("out "))
    assert "crash: the same error twice" in line and "(attempts: 2 crash)" in line, table
