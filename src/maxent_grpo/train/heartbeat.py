"""A trainer's heartbeat: beats from its callbacks and around generation and saves, the stack
dump on DUMP_SIGNAL and the exit report (the files: rundir/heartbeat.py)."""

from __future__ import annotations

import faulthandler
import sys
import time

from maxent_grpo.rundir.heartbeat import DUMP_SIGNAL, Heartbeat


def _install_dump_and_excepthook(heartbeat: Heartbeat) -> None:
    # Kept open for the life of the process: faulthandler writes to its file descriptor.
    stacks = open(heartbeat.dir / f"rank-{heartbeat.rank}.stacks", "a")  # noqa: SIM115
    faulthandler.register(DUMP_SIGNAL, file=stacks, all_threads=True, chain=False)
    previous = sys.excepthook

    def excepthook(kind, exc, tb):
        heartbeat.report_exit(exc)
        previous(kind, exc, tb)

    sys.excepthook = excepthook


def attach_heartbeat(trainer) -> Heartbeat:
    """Beat from the trainer's callbacks and around its generation; register DUMP_SIGNAL and
    the exit report. Call once per process, after the trainer is built."""
    from transformers import TrainerCallback

    heartbeat = Heartbeat(trainer.args.output_dir)
    _install_dump_and_excepthook(heartbeat)

    class Beats(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            heartbeat.step_began = time.monotonic()
            heartbeat.beat("train_begin", state.global_step)

        def on_step_end(self, args, state, control, **kwargs):
            heartbeat.step_done(state.global_step)

        def on_save(self, args, state, control, **kwargs):
            heartbeat.beat("saved", state.global_step)

        def on_prediction_step(self, args, state, control, **kwargs):
            heartbeat.beat("evaluate", state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            heartbeat.beat("train_end", state.global_step)

    trainer.add_callback(Beats())
    _wrap(trainer, "_generate", heartbeat, "generate")
    _wrap(trainer, "_save_checkpoint", heartbeat, "save")
    heartbeat.beat("built", trainer.state.global_step)
    return heartbeat


def _wrap(trainer, name: str, heartbeat: Heartbeat, phase: str) -> None:
    """Beat `<phase>` before and `<phase>_done` after the trainer's method `name` (an
    instance attribute: the trainer's class, whichever method it is, stays as it is)."""
    method = getattr(trainer, name, None)
    if method is None:
        return

    def wrapped(*args, **kwargs):
        heartbeat.beat(phase, trainer.state.global_step)
        result = method(*args, **kwargs)
        heartbeat.beat(f"{phase}_done", trainer.state.global_step)
        return result

    setattr(trainer, name, wrapped)
