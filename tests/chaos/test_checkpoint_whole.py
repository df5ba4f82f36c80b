"""A marked checkpoint whose file was later cut short or removed is not complete (found by
the chaos campaign: its trials checkpoint_truncated and checkpoint_file_removed). Pure: files
written here, no training."""

from __future__ import annotations

import json
import os

from maxent_grpo.rundir.checkpoints import (
    CHECKPOINT_MARKER,
    last_complete_checkpoint,
    mark_checkpoint_complete,
)


def checkpoint(root, step: int):
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"w" * 1000)
    (path / "optimizer.pt").write_bytes(b"o" * 500)
    mark_checkpoint_complete(path, step)
    return path


def test_a_cut_or_missing_file_makes_the_newest_checkpoint_incomplete(tmp_path):
    checkpoint(tmp_path, 2)
    newest = checkpoint(tmp_path, 4)
    assert json.loads((newest / CHECKPOINT_MARKER).read_text())["files"] == {
        "model.safetensors": 1000,
        "optimizer.pt": 500,
    }
    assert last_complete_checkpoint(tmp_path) == newest
    os.truncate(newest / "model.safetensors", 500)
    assert last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-2"
    (tmp_path / "checkpoint-2" / "optimizer.pt").unlink()
    assert last_complete_checkpoint(tmp_path) is None


def test_a_marker_without_sizes_still_counts_and_extra_files_do_not_matter(tmp_path):
    old = checkpoint(tmp_path, 2)
    (old / CHECKPOINT_MARKER).write_text(json.dumps({"step": 2, "time": 0}))
    (old / "eval_samples.jsonl").write_text("{}\n")
    assert last_complete_checkpoint(tmp_path) == old
