"""Kill the trainer anywhere (SIGKILL via failpoints), resume, and get the same final model.

A failpoint SIGKILLs the trainer at a named point (src/maxent_grpo/faults.py): what is left on
disk is what a node failure or an OOM kill would leave. Each case then resumes with the same
command and must finish with weights equal to an uninterrupted run's, never having loaded an
incomplete checkpoint.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers.recipes import small_recipe
from helpers.resume import assert_resumed_from, event_count
from helpers.runs import PYTHON, REPO, run, step_logs
from maxent_grpo.rundir.checkpoints import CHECKPOINT_MARKER, list_checkpoints, run_is_complete

pytestmark = pytest.mark.integration

GRPO = str(REPO / "src" / "grpo.py")
STEPS = 6
# Checkpoints every 2 steps, only the last one kept.
KEYS = dict(max_steps=STEPS, save_steps=2, save_total_limit=1)


def train(path: Path, **env) -> int:
    return attempt(path, **env).returncode


def attempt(path: Path, **env) -> subprocess.CompletedProcess:
    return run([PYTHON, GRPO, "--config", str(path)], timeout=300, **env)


def weights(out: Path) -> dict:
    return load_file(str(out / "model.safetensors"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model) -> Path:
    folder = tmp_path_factory.mktemp("reference")
    assert train(small_recipe(folder, tiny_model, **KEYS)) == 0
    return folder / "out"


# (failpoint, what must be true on disk right after the kill, the checkpoint resumed from:
# 0 for none, 6 for the final one, from which only the final save is left to do)
FAULTS = [
    ("train_start", "no checkpoint yet", 0),
    ("step_begin:3", "checkpoint-2 complete", 2),
    ("checkpoint_partial:4", "checkpoint-4 has the model but no optimizer and no marker", 2),
    ("checkpoint_unmarked:4", "checkpoint-4 fully written but unmarked", 2),
    ("final_save", "final model written, no completion marker", 6),
]


@pytest.mark.parametrize("point, left, resumed_from", FAULTS, ids=[f[0] for f in FAULTS])
def test_sigkill_then_resume_gives_the_uninterrupted_result(
    tmp_path, tiny_model, reference, point, left, resumed_from
):
    path = small_recipe(tmp_path, tiny_model, **KEYS)
    out = tmp_path / "out"
    assert train(path, MAXENT_GRPO_FAILPOINT=point) == -signal.SIGKILL
    assert not run_is_complete(out)
    if point.startswith("checkpoint"):
        cut = out / "checkpoint-4"
        assert cut.is_dir() and not (cut / CHECKPOINT_MARKER).exists(), left
        # Rotation (save_total_limit 1) kept the checkpoint resume needs.
        assert (out / "checkpoint-2" / CHECKPOINT_MARKER).is_file()

    before = event_count(out)
    again = attempt(path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert_resumed_from(out, before, resumed_from, STEPS, log=again.stdout + again.stderr)
    assert run_is_complete(out)
    logs = step_logs(out)
    assert sorted(logs) == list(range(1, STEPS + 1))
    for key, value in weights(reference).items():
        assert (weights(out)[key] - value).abs().max().item() == 0.0, (point, key)
    # Only complete checkpoints remain, and within the rotation limit.
    remaining = list_checkpoints(out)
    assert remaining and all(c.complete for c in remaining), remaining


def test_repeated_kills_at_the_same_point_still_converge(tmp_path, tiny_model, reference):
    path = small_recipe(tmp_path, tiny_model, **KEYS)
    for point in ("checkpoint_unmarked:2", "step_begin:3", "checkpoint_partial:4"):
        assert train(path, MAXENT_GRPO_FAILPOINT=point) == -signal.SIGKILL
    before = event_count(tmp_path / "out")
    assert train(path) == 0
    assert_resumed_from(tmp_path / "out", before, checkpoint=2, max_steps=STEPS)
    for key, value in weights(reference).items():
        assert (weights(tmp_path / "out")[key] - value).abs().max().item() == 0.0, key
