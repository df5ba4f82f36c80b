"""A run's checkpoints on disk: their names, completion markers, rotation and the stop file.

HF Trainer writes `checkpoint-N/` in place, so a job killed mid-save leaves a directory that
looks like a checkpoint but is not one, and `get_last_checkpoint` would pick it. A marker file
is written after every file of the checkpoint is on disk (all ranks done, fsynced), and only
checkpoints that have it are resumed from or kept. The trainers write these files
(train/checkpoints.py); the launcher, evaluations and the runs table read them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

CHECKPOINT_MARKER = "maxent_grpo_complete.json"
RUN_MARKER = "maxent_grpo_training_complete.json"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    complete: bool


def list_checkpoints(output_dir: str | os.PathLike) -> list[Checkpoint]:
    """All `checkpoint-N` directories in output_dir, oldest step first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _CHECKPOINT_RE.match(entry.name)
        if match and entry.is_dir():
            found.append(Checkpoint(int(match.group(1)), entry, checkpoint_is_whole(entry)))
    return sorted(found, key=lambda c: c.step)


def _file_sizes(path: Path) -> dict[str, int]:
    """Every file of a checkpoint but its marker, with its size in bytes."""
    sizes = {}
    for root, _dirs, files in os.walk(path):
        for name in files:
            file = Path(root) / name
            if name != CHECKPOINT_MARKER and not name.startswith(f".{CHECKPOINT_MARKER}."):
                sizes[str(file.relative_to(path))] = file.stat().st_size
    return sizes


def checkpoint_is_whole(path: Path) -> bool:
    """The checkpoint has its marker and every file the marker lists, at the size it had when
    marked. A marker alone is not enough: a node that dies later can leave a file cut short
    or gone (found by bench/chaos.py: resuming from such a checkpoint failed, or trained on
    with a fresh optimizer). Markers written before the sizes were recorded list none."""
    try:
        marker = json.loads((path / CHECKPOINT_MARKER).read_text())
    except (OSError, ValueError):
        return False
    files = marker.get("files", {}) if isinstance(marker, dict) else {}
    for name, size in files.items():
        try:
            if (path / name).stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def last_complete_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The checkpoint to resume from: the newest one whose save finished."""
    complete = [c for c in list_checkpoints(output_dir) if c.complete]
    return complete[-1].path if complete else None


def checkpoints_to_delete(checkpoints: list[Checkpoint], keep: int | None) -> list[Path]:
    """Rotation that can never delete the checkpoint resume needs.

    Keeps the newest `keep` complete checkpoints (all when keep is None or < 1) and removes
    incomplete ones older than the newest complete one (debris of an interrupted save).
    Incomplete ones newer than that are left alone: a save may be in progress.
    """
    complete = [c for c in checkpoints if c.complete]
    if not complete:
        return []
    newest = complete[-1].step
    doomed = [c.path for c in checkpoints if not c.complete and c.step < newest]
    if keep is not None and keep >= 1:
        doomed += [c.path for c in complete[:-keep]]
    return sorted(doomed)


def _fsync_tree(path: Path) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, payload: dict) -> None:
    """Write JSON so that readers see either nothing or the whole file. Several processes may
    write the same file at once (the stop file: the launcher and every rank on a SIGTERM):
    each writes its own temporary file, and the last rename wins."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as handle:
        json.dump(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def mark_checkpoint_complete(checkpoint_dir: str | os.PathLike, step: int) -> None:
    path = Path(checkpoint_dir)
    _fsync_tree(path)
    marker = {"step": step, "time": time.time(), "files": _file_sizes(path)}
    write_json_atomic(path / CHECKPOINT_MARKER, marker)


def delete_checkpoints(paths: list[Path]) -> None:
    for path in paths:
        # Drop the marker first: a kill mid-delete leaves an incomplete, never-picked dir.
        (path / CHECKPOINT_MARKER).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)


def mark_run_complete(output_dir: str | os.PathLike, info: dict) -> None:
    write_json_atomic(Path(output_dir) / RUN_MARKER, {**info, "time": time.time()})


def clear_run_complete(output_dir: str | os.PathLike) -> None:
    """Reopen a completed run (its max_steps was raised): the trainers resume it."""
    (Path(output_dir) / RUN_MARKER).unlink(missing_ok=True)


def run_is_complete(output_dir: str | os.PathLike) -> bool:
    return (Path(output_dir) / RUN_MARKER).is_file()


STOP_REQUEST = "maxent_grpo_stop_requested"


def request_stop(output_dir: str | os.PathLike, reason: str) -> None:
    """Ask the trainers of this run to save a complete checkpoint and exit at the next step.

    A file, not a signal: it reaches every rank on every node (shared output_dir), it cannot
    kill accelerate's launcher (whose default action for SIGUSR1 is to die), and a second
    request is a no-op.
    """
    path = Path(output_dir) / STOP_REQUEST
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        write_json_atomic(path, {"reason": reason, "time": time.time()})


def clear_stop_request(output_dir: str | os.PathLike) -> None:
    (Path(output_dir) / STOP_REQUEST).unlink(missing_ok=True)


def stop_requested(output_dir: str | os.PathLike) -> bool:
    return (Path(output_dir) / STOP_REQUEST).is_file()


def stop_request_reason(output_dir: str | os.PathLike) -> str | None:
    """Why a stop was requested (the stop file's reason), None without a request."""
    try:
        return str(json.loads((Path(output_dir) / STOP_REQUEST).read_text()).get("reason"))
    except (OSError, ValueError, AttributeError):
        return "stop requested through the stop file" if stop_requested(output_dir) else None
