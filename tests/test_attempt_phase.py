"""The attempt's phases and what a stop signal does in each (launch/attempt_phase.py), acted
on by the attempt's signal handler (launch/attempt.py _Signals) as the table says."""

from __future__ import annotations

import itertools
import signal

import pytest

from maxent_grpo.launch.attempt import Attempt, _Signals
from maxent_grpo.launch.attempt_phase import (
    CHECKPOINT,
    FINISHING,
    FORCE,
    NOTE,
    RUNNING,
    STOP_NOW,
    STOPPING,
    TABLE,
    asks_about_nodes,
)
from maxent_grpo.launch.launcher import RunRequest

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def test_the_table_answers_every_phase_signal_and_node_state():
    cases = set(itertools.product((RUNNING, STOPPING, FINISHING), SIGNALS, (False, True)))
    assert set(TABLE) == cases
    # Slurm is asked about a failed node only where the answer changes what happens.
    asked = {(p, s) for p, s, _ in cases if asks_about_nodes(p, s)}
    assert asked == {(RUNNING, signal.SIGTERM)}


def _attempt_in(phase: str, failed: bool) -> tuple[Attempt, list[float]]:
    attempt = Attempt(RunRequest(recipe="recipe.yaml"), environ={})
    aborted: list[float] = []
    attempt.abort = lambda grace=5: aborted.append(grace)
    attempt.node_failed = lambda: failed
    if phase != RUNNING:
        attempt.request_stop("SIGUSR1 received", signal.SIGUSR1)
    attempt.finishing = phase == FINISHING
    assert attempt.phase == phase
    return attempt, aborted


@pytest.mark.parametrize("case", sorted(TABLE, key=str), ids=str)
def test_each_signal_does_what_the_table_says(case, capsys):
    phase, signum, failed = case
    action, after = TABLE[case]
    attempt, aborted = _attempt_in(phase, failed)
    before = attempt.stop_reason
    with _Signals(attempt) as handler:
        handler._handle(signum, None)
    assert attempt.phase == after
    assert aborted == {FORCE: [5], STOP_NOW: [1]}.get(action, [])
    assert (attempt.late_signal == signum) == (action == NOTE)
    assert (attempt.forced is not None) == (action == FORCE)
    if action in (CHECKPOINT, STOP_NOW):  # the first request names its signal
        assert attempt.stop_reason == (before or f"{signal.Signals(signum).name} received")
    said = capsys.readouterr().out
    assert signal.Signals(signum).name in said


def test_what_each_phase_does_with_a_stop_signal():
    from maxent_grpo.launch.attempt_phase import on_signal

    for signum in SIGNALS:  # the first: a checkpoint at the next step boundary
        assert on_signal(RUNNING, signum) == (CHECKPOINT, STOPPING)
        assert on_signal(FINISHING, signum) == (NOTE, FINISHING)  # training is over
    assert on_signal(RUNNING, signal.SIGTERM, node_failed=True) == (STOP_NOW, STOPPING)
    assert on_signal(STOPPING, signal.SIGTERM) == on_signal(STOPPING, signal.SIGINT)
    assert on_signal(STOPPING, signal.SIGINT) == (FORCE, STOPPING)  # the second: now
    assert on_signal(STOPPING, signal.SIGUSR1) == (CHECKPOINT, STOPPING)  # Slurm's again
