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


class Beats:
    """Component (train/components.py), every trainer, outermost: beats `generate` and
    `save` before, `generate_done` and `save_done` after each generation and checkpoint save,
    once attach_heartbeat has given it the process's heartbeat (none before: tests and
    benchmarks that build a trainer alone)."""

    name = "heartbeat"
    needs = ()

    def __init__(self, trainer):
        self.trainer = trainer
        self.heartbeat: Heartbeat | None = None

    def _around(self, phase: str, call, *args):
        heartbeat = self.heartbeat
        if heartbeat is None:
            return call(*args)
        heartbeat.beat(phase, self.trainer.state.global_step)
        result = call(*args)
        heartbeat.beat(f"{phase}_done", self.trainer.state.global_step)
        return result

    def generate(self, call, prompts):
        return self._around("generate", call, prompts)

    def save_checkpoint(self, call, model, trial):
        return self._around("save", call, model, trial)


def attach_heartbeat(trainer) -> Heartbeat:
    """Beat from the trainer's callbacks and, through its Beats component, around its
    generations and saves; register DUMP_SIGNAL and the exit report. Call once per process,
    after the trainer is built."""
    from transformers import TrainerCallback

    heartbeat = Heartbeat(trainer.args.output_dir)
    _install_dump_and_excepthook(heartbeat)

    class Callbacks(TrainerCallback):
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

    trainer.add_callback(Callbacks())
    trainer.component("heartbeat").heartbeat = heartbeat
    heartbeat.beat("built", trainer.state.global_step)
    return heartbeat
