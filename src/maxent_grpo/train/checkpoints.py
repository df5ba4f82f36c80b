"""The trainer's side of complete checkpoints: marking them, rotating only complete ones, and
stopping at a step boundary on request (the stop file or SIGTERM).

The files themselves (names, markers, the stop file) are rundir/checkpoints.py: the launcher,
evaluations and the runs table read them without importing the trainer.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from maxent_grpo.faults import failpoint
from maxent_grpo.rundir.checkpoints import (
    CHECKPOINT_MARKER,
    checkpoints_to_delete,
    delete_checkpoints,
    list_checkpoints,
    mark_checkpoint_complete,
    request_stop,
    stop_requested,
)
from maxent_grpo.rundir.events import emit
from maxent_grpo.timers import timed
from maxent_grpo.train.state import state_registry


class CompleteCheckpoints:
    """Component (train/components.py), every trainer: mark checkpoints complete after saving,
    rotate only complete ones, and save and restore the registered trainer state
    (train/state.py) with every checkpoint. The only component with checkpoint hooks: the
    others register their state instead."""

    name = "checkpoints"
    needs = ()

    def __init__(self, trainer):
        self.trainer = trainer

    def save_checkpoint(self, call, model, trial):
        with timed("checkpoint_save"):
            self._save_complete(call, model, trial)

    def _save_complete(self, call, model, trial):
        trainer = self.trainer
        run_dir = Path(trainer.args.output_dir)  # no hyperparameter search: no trial dirs
        step = trainer.state.global_step
        checkpoint_dir = run_dir / f"checkpoint-{step}"
        if (checkpoint_dir / CHECKPOINT_MARKER).is_file():
            # Already saved at this step (e.g. a stop signal right after a periodic save):
            # rewriting it would make a complete checkpoint incomplete for a while.
            return
        # TRL/HF rotate inside _save_checkpoint, before we could mark the new one complete:
        # a kill in between would leave nothing to resume. Rotate ourselves, afterwards.
        limit = trainer.args.save_total_limit
        trainer.args.save_total_limit = None
        try:
            call(model, trial)
        finally:
            trainer.args.save_total_limit = limit
        accelerator = trainer.accelerator
        state_registry(trainer).save(
            checkpoint_dir, accelerator.process_index, accelerator.num_processes
        )
        failpoint("checkpoint_unmarked", step)
        accelerator.wait_for_everyone()
        if trainer.args.should_save:
            mark_checkpoint_complete(checkpoint_dir, step)
            emit(run_dir, "checkpoint", step=step, path=str(checkpoint_dir))
            delete_checkpoints(checkpoints_to_delete(list_checkpoints(run_dir), limit))
        accelerator.wait_for_everyone()

    def save_optimizer(self, call, output_dir):
        failpoint("checkpoint_partial", self.trainer.state.global_step)
        return call(output_dir)

    def load_optimizer(self, call, checkpoint):
        """HF Trainer's one call on a resume, on every back end: the optimizer and scheduler,
        then every piece of registered state."""
        if checkpoint is None:
            return
        self._load_optimizer_and_scheduler(call, checkpoint)
        accelerator = self.trainer.accelerator
        state_registry(self.trainer).load(
            Path(checkpoint), accelerator.process_index, accelerator.num_processes
        )

    def _load_optimizer_and_scheduler(self, call, checkpoint):
        trainer = self.trainer
        device = trainer.args.device
        plain = not (trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled)
        if device.type != "cpu" or device.index is None or not plain:
            return call(checkpoint)
        # Multi-process CPU runs: transformers passes map_location=cpu:0, which torch.load
        # cannot restore ("don't know how to restore data location ... cpu:0"). Its plain
        # (no DeepSpeed/FSDP/XLA) branch, with map_location="cpu".
        import torch
        from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME

        optimizer, scheduler = Path(checkpoint) / OPTIMIZER_NAME, Path(checkpoint) / SCHEDULER_NAME
        if optimizer.is_file() and scheduler.is_file():
            for target, path in ((trainer.optimizer, optimizer), (trainer.lr_scheduler, scheduler)):
                target.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))


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


class StopVote:
    """The ranks' per-step agreement on stopping, off the device's critical path.

    Each rank votes before the optimizer step (`send`: an asynchronous all-reduce of one
    number on the default process group) and reads the sum at the step's end (`receive`).
    Every rank reads the same sum at the same step, so all stop together. On a GPU the sum is
    copied into pinned host memory behind the all-reduce and read through a CUDA event
    recorded before the optimizer step was queued: the host never waits for the optimizer
    step (a blocking `.item()` at the step's end did, every step, and the GPU then idled
    until the next step's first kernels). On CPU (gloo) the all-reduce runs while the
    optimizer steps. Cost: a request that arrives after a step's vote (during its optimizer
    step, callbacks, logging or save) stops the run one step later.
    """

    def __init__(self, device):
        import torch

        self.flag = torch.zeros(1, device=device)
        cuda = device.type == "cuda"
        self.host = torch.zeros(1, pin_memory=True) if cuda else self.flag
        self.sum = self.host.numpy()  # the host memory itself: reading it calls no torch op
        self.ready = torch.cuda.Event() if cuda else None
        self.work = None

    def send(self, seen: bool) -> None:
        import torch.distributed as dist

        self.flag.fill_(float(seen))
        self.work = dist.all_reduce(self.flag, op=dist.ReduceOp.SUM, async_op=True)
        if self.ready is not None:
            self.work.wait()  # NCCL: the current stream waits for it, not the host
            self.host.copy_(self.flag, non_blocking=True)
            self.ready.record()

    def receive(self) -> bool:
        """Whether any rank voted to stop; waits only for this step's vote."""
        if self.ready is not None:
            self.ready.synchronize()
        else:
            self.work.wait()
        self.work = None
        return bool(self.sum[0] > 0)


def make_stop_callback(trainer):
    """A TrainerCallback: save and stop at a step boundary after request_stop() or a SIGTERM
    (install_stop_signal_handler, installed here).

    Alone, a process checks at the end of every step and stops there. Several processes must
    stop at the same step: they agree through a StopVote per step (any rank that sees the
    request stops everyone), cast before the optimizer step and read at the step's end.
    """
    from transformers import TrainerCallback

    install_stop_signal_handler(trainer.args.output_dir)
    accelerator = trainer.accelerator
    vote = StopVote(accelerator.device) if accelerator.num_processes > 1 else None

    class StopOnRequest(TrainerCallback):
        stopped = False

        def on_step_begin(self, args, state, control, **kwargs):
            failpoint("step_begin", state.global_step + 1)

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            failpoint("optimizer_step", state.global_step + 1)
            if vote is not None:
                with timed("stop_callback"):
                    vote.send(stop_signalled() or stop_requested(args.output_dir))

        def on_step_end(self, args, state, control, **kwargs):
            with timed("stop_callback"):
                if vote is None:
                    seen = stop_signalled() or stop_requested(args.output_dir)
                else:
                    if vote.work is None:  # no optimizer step in this step: vote now
                        vote.send(stop_signalled() or stop_requested(args.output_dir))
                    seen = vote.receive()
            if seen:
                self.stopped = True
                control.should_save = True
                control.should_training_stop = True
            return control

    return StopOnRequest()
