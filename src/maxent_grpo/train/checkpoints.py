"""Complete checkpoints: which ones exist, which one to resume, which ones to delete.

HF Trainer writes `checkpoint-N/` in place, so a job killed mid-save leaves a directory that
looks like a checkpoint but is not one, and `get_last_checkpoint` would pick it. We write a
marker file after every file of the checkpoint is on disk (all ranks done, fsynced) and only
ever resume from, or keep, checkpoints that have it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.faults import failpoint

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
            complete = (entry / CHECKPOINT_MARKER).is_file()
            found.append(Checkpoint(int(match.group(1)), entry, complete))
    return sorted(found, key=lambda c: c.step)


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
    write_json_atomic(path / CHECKPOINT_MARKER, {"step": step, "time": time.time()})


def delete_checkpoints(paths: list[Path]) -> None:
    for path in paths:
        # Drop the marker first: a kill mid-delete leaves an incomplete, never-picked dir.
        (path / CHECKPOINT_MARKER).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)


def mark_run_complete(output_dir: str | os.PathLike, info: dict) -> None:
    write_json_atomic(Path(output_dir) / RUN_MARKER, {**info, "time": time.time()})


def run_is_complete(output_dir: str | os.PathLike) -> bool:
    return (Path(output_dir) / RUN_MARKER).is_file()


class CompleteCheckpointsMixin:
    """Trainer mixin: mark checkpoints complete after saving, rotate only complete ones.

    Mixed in before TRL's trainer class (`class T(CompleteCheckpointsMixin, GRPOTrainer)`).
    """

    def _save_checkpoint(self, model, trial):
        run_dir = Path(self._get_output_dir(trial=trial))
        checkpoint_dir = run_dir / f"checkpoint-{self.state.global_step}"
        if (checkpoint_dir / CHECKPOINT_MARKER).is_file():
            # Already saved at this step (e.g. a stop signal right after a periodic save):
            # rewriting it would make a complete checkpoint incomplete for a while.
            return
        # TRL/HF rotate inside _save_checkpoint, before we could mark the new one complete:
        # a kill in between would leave nothing to resume. Rotate ourselves, afterwards.
        limit = self.args.save_total_limit
        self.args.save_total_limit = None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        failpoint("checkpoint_unmarked", self.state.global_step)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            # Imported here: the runs package reads this module's marker names.
            from maxent_grpo.runs.events import emit

            mark_checkpoint_complete(checkpoint_dir, self.state.global_step)
            emit(run_dir, "checkpoint", step=self.state.global_step, path=str(checkpoint_dir))
            delete_checkpoints(checkpoints_to_delete(list_checkpoints(run_dir), limit))
        self.accelerator.wait_for_everyone()

    def _save_optimizer_and_scheduler(self, output_dir):
        failpoint("checkpoint_partial", self.state.global_step)
        return super()._save_optimizer_and_scheduler(output_dir)

    def _load_optimizer_and_scheduler(self, checkpoint):
        device = self.args.device
        plain = not (self.is_deepspeed_enabled or self.is_fsdp_enabled)
        if checkpoint is None or device.type != "cpu" or device.index is None or not plain:
            return super()._load_optimizer_and_scheduler(checkpoint)
        # Multi-process CPU runs: transformers passes map_location=cpu:0, which torch.load
        # cannot restore ("don't know how to restore data location ... cpu:0"). Its plain
        # (no DeepSpeed/FSDP/XLA) branch, with map_location="cpu".
        import torch
        from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME

        optimizer, scheduler = Path(checkpoint) / OPTIMIZER_NAME, Path(checkpoint) / SCHEDULER_NAME
        if optimizer.is_file() and scheduler.is_file():
            for target, path in ((self.optimizer, optimizer), (self.lr_scheduler, scheduler)):
                target.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))


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


# The stop signals this training process received (SIGTERM): a graceful stop, like the file.
_STOP_SIGNALS: list[str] = []


def install_stop_signal_handler(output_dir: str | os.PathLike) -> bool:
    """SIGTERM asks this training process for a graceful stop instead of killing it.

    Slurm (preemption, scancel, the end of the time limit) and torchrun's agent send SIGTERM
    to every process. The handler only notes the signal and writes the stop file (which tells
    the launcher, and every rank through the per-step all-reduce); the step in progress
    finishes, a complete checkpoint is saved, and the process exits. Repeated signals are
    no-ops: the agent forwards the SIGTERM the worker already got from Slurm. A hard stop is
    SIGKILL (Slurm's KillWait, the agent's TORCH_ELASTIC_SHUTDOWN_TIMEOUT, the launcher).
    Returns False off the main thread, where Python cannot install handlers.
    """

    def handle(signum: int, _frame) -> None:
        if _STOP_SIGNALS:
            return
        name = signal.Signals(signum).name
        _STOP_SIGNALS.append(name)
        rank = os.environ.get("RANK", "0")
        # os.write, not print: a handler that prints can hit a reentrant buffered write.
        message = f"{name} received by rank {rank}: checkpointing at the next step boundary\n"
        os.write(2, message.encode())
        try:
            request_stop(output_dir, f"{name} received by the training processes")
        except OSError:
            pass  # the flag alone still stops this rank (and, through it, every rank)

    try:
        signal.signal(signal.SIGTERM, handle)
    except ValueError:
        return False
    return True


def stop_signalled() -> bool:
    """Whether this process received a stop signal (install_stop_signal_handler)."""
    return bool(_STOP_SIGNALS)


def make_stop_callback(trainer):
    """A TrainerCallback: save and stop at the first step boundary after request_stop() or a
    SIGTERM (install_stop_signal_handler, installed here).

    Every rank must stop at the same step, so the ranks agree with one tiny all-reduce per
    step (any rank that sees the request stops everyone).
    """
    import torch
    from transformers import TrainerCallback

    install_stop_signal_handler(trainer.args.output_dir)

    class StopOnRequest(TrainerCallback):
        stopped = False

        def on_step_begin(self, args, state, control, **kwargs):
            failpoint("step_begin", state.global_step + 1)

        def on_step_end(self, args, state, control, **kwargs):
            seen = stop_signalled() or stop_requested(args.output_dir)
            if trainer.accelerator.num_processes > 1:
                flag = torch.tensor([float(seen)], device=trainer.accelerator.device)
                seen = trainer.accelerator.reduce(flag, "sum").item() > 0
            if seen:
                self.stopped = True
                control.should_save = True
                control.should_training_stop = True
            return control

    return StopOnRequest()
