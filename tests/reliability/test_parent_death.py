"""A training process whose parent dies stops (launch/processes.py stop_with_parent): a
SIGKILLed launcher's one-rank trainer trained on outside its job (seeds 3242996796,
2909567359, 3843838547 under Slurm's proctrack/linuxproc).

The launcher's parent-death SIGTERM reaches accelerate's launcher; with one rank accelerate's
simple launcher just dies (it forwards nothing), and its trainer, re-parented, trained on. Now
each training process the launcher starts asks for SIGTERM when its own parent dies: it saves
at the next step boundary and exits.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.chaos_checks import intact_steps
from helpers.paths import MAXENT_GRPO, REPO
from helpers.procs import LOADED_MARGIN, live_processes, wait_for, wait_until_gone
from helpers.recipes import ONE_THREAD, small_recipe
from helpers.resume import attempt_steps
from helpers.runs import child_env
from maxent_grpo.launch.processes import STOP_WITH_PARENT, stop_with_parent
from maxent_grpo.rundir.checkpoints import run_is_complete

# The trainer, the parent's process here: the SIGTERM handler notes the signal in a file.
TRAINER = """
import os, signal, sys, time
from maxent_grpo.launch.processes import stop_with_parent

def noted(signum, frame):
    with open(sys.argv[1], "a") as handle:
        handle.write(signal.Signals(signum).name + "\\n")

signal.signal(signal.SIGTERM, noted)
if sys.argv[2] == "raced":  # the parent died between the two reads of the parent's pid
    parents = iter([os.getppid(), 1])
    os.getppid = lambda: next(parents)
print(stop_with_parent(), flush=True)
open(sys.argv[1] + ".ready", "w").close()
time.sleep(60)
"""
# Its parent: starts it and waits, as accelerate's simple launcher does.
PARENT = "import subprocess, sys; subprocess.Popen(sys.argv[1:]).wait()"


def pdeathsig() -> int:
    """This process's parent-death signal (prctl PR_GET_PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    value = ctypes.c_int(0)
    libc.prctl(2, ctypes.byref(value), 0, 0, 0)
    return value.value


def test_off_unless_the_launcher_asks():
    """`nohup python src/grpo.py &` outlives its shell: nothing asked without the variable."""
    before = pdeathsig()
    assert stop_with_parent({}) is False
    assert pdeathsig() == before


@pytest.mark.parametrize("how", ["killed", "raced"])
def test_a_trainer_gets_sigterm_when_its_parent_dies(tmp_path, how):
    """killed: the parent SIGKILLed while the trainer runs; raced: the parent died before the
    prctl (no signal would come: the trainer signals itself)."""
    noted = tmp_path / "signals"
    trainer = [sys.executable, "-c", TRAINER, str(noted), how]
    env = {**os.environ, STOP_WITH_PARENT: "1"}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, *trainer], env=env)
    try:
        wait_for(lambda: Path(f"{noted}.ready").exists(), 60, "the trainer", 0.05, parent)
        if how == "killed":
            parent.kill()
        wait_for(lambda: noted.is_file() and noted.read_text(), 10, "the trainer's SIGTERM", 0.05)
        assert noted.read_text() == "SIGTERM\n"
    finally:
        parent.kill()
        parent.wait(30)
        for line in live_processes(marker=str(noted)):  # the trainer, if it was not signalled
            os.kill(int(line.split()[0]), signal.SIGKILL)


# A step, its save and the exit, on a loaded 2-core machine.
STOP_BOUND = 30 + LOADED_MARGIN


@pytest.mark.integration
def test_a_sigkilled_launchers_single_trainer_saves_its_step_and_stops(tmp_path, tiny_model):
    """`maxent-grpo run` of a one-rank run SIGKILLed mid-training: its trainer stops within
    STOP_BOUND, with a complete checkpoint at the step it reached, and nothing of the run is
    left (it trained on to max_steps before)."""
    out = tmp_path / "out"
    path = small_recipe(tmp_path, tiny_model, max_steps=2000, num_processes=1, **ONE_THREAD)
    args = [MAXENT_GRPO, "run", "--config", str(path), "--logs-dir", str(tmp_path / "logs")]
    with open(tmp_path / "launcher.out", "ab") as log:
        proc = subprocess.Popen(args, cwd=REPO, env=child_env(), stdout=log, stderr=log)
    try:
        wait_for(lambda: len(attempt_steps(out, 0)) >= 2, 300, "two steps", 0.2, proc)
        proc.kill()
        proc.wait(30)
        left, waited = wait_until_gone(marker=str(tmp_path), timeout=STOP_BOUND)
        print(f"\nMEASURED launcher SIGKILLed -> nothing of the run left: {waited:.1f}s")
        assert not left, left
    finally:
        for line in live_processes(marker=str(tmp_path)):
            os.kill(int(line.split()[0]), signal.SIGKILL)
    steps = attempt_steps(out, 0)
    assert steps and intact_steps(out)[-1:] == [steps[-1]], (steps, intact_steps(out))
    assert not run_is_complete(out)
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("*_train.log"))
    assert "SIGTERM received by rank 0: checkpointing at the next step boundary" in logs
