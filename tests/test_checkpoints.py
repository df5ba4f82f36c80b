"""Which checkpoint resume picks and which ones rotation deletes (pure planning + markers)."""

from pathlib import Path

from maxent_grpo.rundir.checkpoints import (
    CHECKPOINT_MARKER,
    Checkpoint,
    checkpoints_to_delete,
    delete_checkpoints,
    last_complete_checkpoint,
    list_checkpoints,
    mark_checkpoint_complete,
    mark_run_complete,
    run_is_complete,
)


def make(root: Path, step: int, complete: bool) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"x" * 10)
    if complete:
        mark_checkpoint_complete(path, step)
    return path


def test_resume_picks_newest_complete_not_newest(tmp_path):
    make(tmp_path, 5, True)
    make(tmp_path, 10, True)
    make(tmp_path, 15, False)  # cut off mid-save
    (tmp_path / "checkpoint-junk").mkdir()
    assert last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-10"


def test_steps_sort_numerically(tmp_path):
    for step in (9, 10, 100):
        make(tmp_path, step, True)
    assert [c.step for c in list_checkpoints(tmp_path)] == [9, 10, 100]
    assert last_complete_checkpoint(tmp_path).name == "checkpoint-100"


def test_nothing_to_resume(tmp_path):
    assert last_complete_checkpoint(tmp_path / "missing") is None
    make(tmp_path, 3, False)
    assert last_complete_checkpoint(tmp_path) is None


def cps(*spec):
    return [Checkpoint(step, Path(f"checkpoint-{step}"), done) for step, done in spec]


def test_rotation_keeps_newest_complete_ones():
    plan = checkpoints_to_delete(cps((1, True), (2, True), (3, True)), keep=2)
    assert plan == [Path("checkpoint-1")]


def test_rotation_never_deletes_what_resume_needs():
    # The newest is incomplete: the newest complete one must survive even with keep=1.
    plan = checkpoints_to_delete(cps((1, True), (2, True), (3, False)), keep=1)
    assert plan == [Path("checkpoint-1")]
    assert checkpoints_to_delete(cps((1, False), (2, False)), keep=1) == []


def test_rotation_removes_debris_older_than_newest_complete():
    plan = checkpoints_to_delete(cps((1, False), (2, True), (3, True)), keep=None)
    assert plan == [Path("checkpoint-1")]


def test_delete_removes_marker_first_and_dirs(tmp_path):
    path = make(tmp_path, 1, True)
    delete_checkpoints([path])
    assert not path.exists()


def test_markers_are_complete_json(tmp_path):
    path = make(tmp_path, 7, True)
    assert (path / CHECKPOINT_MARKER).read_text().startswith('{"step": 7')
    assert not list(path.glob(".*.tmp"))
    assert not run_is_complete(tmp_path)
    mark_run_complete(tmp_path, {"global_step": 7})
    assert run_is_complete(tmp_path)
