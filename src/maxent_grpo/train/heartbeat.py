"""A trainer's heartbeat: beats from its callbacks and around generation and saves, the stack
dump on DUMP_SIGNAL (then the process stops) and the exit report (the files:
rundir/heartbeat.py)."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time

from maxent_grpo.rundir.heartbeat import DUMP_SIGNAL, Heartbeat


def _stand_still(_signum, _frame) -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def install_stack_dump(stacks) -> bool:
    """On DUMP_SIGNAL, faulthandler writes every thread's stack to `stacks` (an open file),
    then this process stops itself (SIGSTOP). Returns whether it stops (main thread only).

    The launcher sends DUMP_SIGNAL only to a run it is about to kill as hung
    (launch/stacks.py), and a rank stopped with SIGSTOP must be continued to write: without
    the stop it trained on until the kill and could finish the run (seeds 2653940617,
    2550607500, 3698213687: `completed` after a hang). faulthandler's C handler writes the
    dump inside the signal handler, then (chain=True) raises the signal again for the
    handler registered before it: Python's, which runs on the main thread at its next
    bytecode and stops the process. Off the main thread Python cannot install a handler:
    the dump alone, and the launcher stops the process itself once the dump is written.
    """
    faulthandler.unregister(DUMP_SIGNAL)  # signal.signal would replace its C handler
    chain = threading.current_thread() is threading.main_thread()
    if chain:
        signal.signal(DUMP_SIGNAL, _stand_still)
    faulthandler.register(DUMP_SIGNAL, file=stacks, all_threads=True, chain=chain)
    return chain


def _install_dump_and_excepthook(heartbeat: Heartbeat) -> None:
    # Kept open for the life of the process: faulthandler writes to its file descriptor.
    stacks = open(heartbeat.dir / f"rank-{heartbeat.rank}.stacks", "a")  # noqa: SIM115
    install_stack_dump(stacks)
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
