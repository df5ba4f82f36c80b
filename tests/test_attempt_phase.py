"""The attempt as one state machine (launch/attempt_phase.py TABLE): its transitions, what a
stop signal does in each state, and that the edge (launch/attempt.py: _Signals, Attempt._drive)
does what the table says."""

from __future__ import annotations

import itertools
import signal

import pytest

from maxent_grpo.launch import attempt_phase as phase
from maxent_grpo.launch.attempt import ACTIONS, Attempt, _Signals
from maxent_grpo.launch.attempt_phase import (
    CHECKPOINT,
    ENDING,
    FINISHING,
    FORCE,
    LIVE,
    NOTE,
    PREPARING,
    SIGNAL_EVENTS,
    STARTING,
    STATES,
    STOP_NOW,
    STOPPING,
    TABLE,
    TERMINAL,
    TRAINING,
    asks_about_nodes,
    signal_event,
    transition,
)
from maxent_grpo.launch.launcher import RunRequest

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
SIGNAL_ACTIONS = {CHECKPOINT, STOP_NOW, FORCE, NOTE}  # carried out by _Signals


def _exits(state: str) -> set[str]:
    return {after for (s, _), (after, _) in TABLE.items() if s == state and after != state}


def test_every_state_is_reachable_from_preparing_and_reaches_an_end():
    reached, frontier = {PREPARING}, [PREPARING]
    while frontier:
        for after in _exits(frontier.pop()) - reached:
            reached.add(after)
            frontier.append(after)
    assert reached == set(STATES)
    for state in set(STATES) - set(TERMINAL):  # no dead end: a terminal state is reachable
        seen, frontier = {state}, [state]
        while frontier and not seen.intersection(TERMINAL):
            for after in _exits(frontier.pop()) - seen:
                seen.add(after)
                frontier.append(after)
        assert seen.intersection(TERMINAL), state


def test_terminal_states_have_no_exits():
    for state in TERMINAL:
        rows = {event: TABLE[(s, event)] for s, event in TABLE if s == state}
        assert set(rows) == {*SIGNAL_EVENTS, phase.STOP_ASKED}  # no event of the flow
        assert all(after == state for after, _ in rows.values())
        assert {rows[e] for e in SIGNAL_EVENTS} == {(state, (NOTE,))}  # a late signal: noted


def test_every_state_answers_every_stop_signal_and_node_state():
    cases = set(itertools.product(STATES, SIGNAL_EVENTS))
    assert cases <= set(TABLE)
    # Slurm is asked about a failed node only where the answer changes what happens: once
    # processes run and no stop was asked yet.
    asked = {(s, n) for s, n in itertools.product(STATES, SIGNALS) if asks_about_nodes(s, n)}
    assert asked == {(s, signal.SIGTERM) for s in (STARTING, TRAINING, ENDING)}


def test_what_each_state_does_with_a_stop_signal():
    term, usr1 = signal_event(signal.SIGTERM), signal_event(signal.SIGUSR1)
    for state, signum in itertools.product(LIVE, SIGNALS):  # the first: checkpoint
        assert transition(state, signal_event(signum)) == (STOPPING, (CHECKPOINT,))
        assert transition(FINISHING, signal_event(signum)) == (FINISHING, (NOTE,))  # over
    for state in (STARTING, TRAINING, ENDING):  # Slurm's SIGTERM for a failed node: now
        failed = signal_event(signal.SIGTERM, True)
        assert transition(state, failed) == (STOPPING, (STOP_NOW,))
    assert transition(PREPARING, signal_event(signal.SIGTERM, True)) == (STOPPING, (CHECKPOINT,))
    assert transition(STOPPING, term) == transition(STOPPING, signal_event(signal.SIGINT))
    assert transition(STOPPING, term) == (STOPPING, (FORCE,))  # the second: everything now
    assert transition(STOPPING, usr1) == (STOPPING, (CHECKPOINT,))  # Slurm's warning again


def test_what_a_lost_server_a_hang_and_the_trainers_exit_lead_to():
    for event in (phase.SERVER_LOST, phase.HANG, phase.TRAINERS_EXITED):
        ended = (phase.END_PROCESSES, phase.CLASSIFY)
        assert transition(TRAINING, event) == (ENDING, ended)
        assert transition(STOPPING, event) == (STOPPING, ended)  # a second signal still forces
    assert transition(STARTING, phase.SERVER_LOST) == (ENDING, ended)
    assert (STARTING, phase.HANG) not in TABLE  # no hang before every server answered
    killed = (phase.END_PROCESSES, phase.CLASSIFY_CRASH)
    assert transition(STARTING, phase.SERVER_KILLED) == (ENDING, killed)
    assert transition(ENDING, phase.CLASSIFIED) == (FINISHING, (phase.FINISH,))
    assert transition(STOPPING, phase.CLASSIFIED) == (FINISHING, (phase.FINISH,))
    finished = {e: transition(FINISHING, e)[0] for s, e in TABLE if s == FINISHING}
    assert finished == {
        phase.RUN_COMPLETED: phase.DONE,
        phase.JOB_REQUEUED: phase.REQUEUED,
        phase.RUN_STOPPED: phase.STOPPED,
        phase.RUN_FAILED: phase.FAILED,
        **{e: FINISHING for e in (*SIGNAL_EVENTS, phase.STOP_ASKED)},
    }


def test_a_stop_before_anything_started_starts_nothing():
    assert phase.START in transition(PREPARING, phase.PREPARED)[1]
    after, actions = transition(STOPPING, phase.PREPARED)
    assert after == STOPPING and phase.START not in actions
    assert actions[-1] == phase.CLASSIFY  # the stop is the outcome


def test_every_action_of_the_table_has_its_edge():
    actions = {a for _, acts in TABLE.values() for a in acts}
    assert actions == SIGNAL_ACTIONS | set(ACTIONS)
    assert all(callable(getattr(Attempt, method)) for method in ACTIONS.values())


def _attempt_in(state: str, failed: bool) -> tuple[Attempt, list[float]]:
    attempt = Attempt(RunRequest(recipe="recipe.yaml"), environ={})
    aborted: list[float] = []
    attempt.abort = lambda grace=5: aborted.append(grace)
    attempt.node_failed = lambda: failed
    if state == STOPPING:
        attempt.request_stop("SIGUSR1 received", signal.SIGUSR1)
    attempt.state = state
    return attempt, aborted


@pytest.mark.parametrize(
    "case", sorted(itertools.product(STATES, SIGNALS, (False, True)), key=str), ids=str
)
def test_each_signal_does_what_the_table_says(case, capsys):
    state, signum, failed = case
    asked = failed and asks_about_nodes(state, signum)
    after, (action,) = transition(state, signal_event(signum, asked))
    attempt, aborted = _attempt_in(state, failed)
    before = attempt.stop_reason
    with _Signals(attempt) as handler:
        handler._handle(signum, None)
    assert attempt.state == after
    assert aborted == {FORCE: [5], STOP_NOW: [1]}.get(action, [])
    assert (attempt.late_signal == signum) == (action == NOTE)
    assert (attempt.forced is not None) == (action == FORCE)
    if action in (CHECKPOINT, STOP_NOW):  # the first request names its signal
        assert attempt.stop_reason == (before or f"{signal.Signals(signum).name} received")
    said = capsys.readouterr().out
    assert signal.Signals(signum).name in said


def _scripted(monkeypatch, start_event: str, during_start=None) -> tuple[Attempt, list[str]]:
    """An attempt whose actions only record their names; `_start` ends with start_event
    (after during_start(attempt), e.g. a signal arriving while training runs)."""
    done: list[str] = []
    attempt = Attempt(RunRequest(recipe="recipe.yaml"), environ={})
    attempt.abort = lambda grace=5: done.append(f"abort {grace}")
    returns = {
        "_start": start_event,
        "_classify": phase.CLASSIFIED,
        "_classify_crash": phase.CLASSIFIED,
        "_finish": phase.RUN_COMPLETED,
        "_give_up": phase.REFUSED,
    }
    for action, method in ACTIONS.items():

        def act(action=action, method=method):
            done.append(action)
            if method == "_start" and during_start is not None:
                during_start(attempt)
            if method == "_refuse":
                raise RuntimeError("refused")
            return returns.get(method)

        monkeypatch.setattr(attempt, method, act)
    return attempt, done


def test_the_edge_carries_out_the_table_in_order(monkeypatch):
    attempt, done = _scripted(monkeypatch, phase.TRAINERS_EXITED)
    attempt._drive(phase.PREPARED)
    assert attempt.state == phase.DONE
    assert done == [phase.BEGIN, phase.START, phase.END_PROCESSES, phase.CLASSIFY, phase.FINISH]


def test_a_signal_while_training_runs_moves_the_rest_of_the_flow(monkeypatch, capsys):
    def sigterm(attempt):  # Slurm's preemption while the trainers run
        with _Signals(attempt) as handler:
            handler._handle(signal.SIGTERM, None)
        assert attempt.state == STOPPING
        handler._handle(signal.SIGTERM, None)  # and again: everything stops now

    attempt, done = _scripted(monkeypatch, phase.TRAINERS_EXITED, sigterm)
    attempt._drive(phase.PREPARED)
    assert done == [
        phase.BEGIN,
        phase.START,
        "abort 5",  # the second SIGTERM's force
        phase.END_PROCESSES,
        phase.CLASSIFY,
        phase.FINISH,
    ]
    assert attempt.stop_reason == "SIGTERM received" and attempt.forced == "SIGTERM"
    assert attempt.state == phase.DONE
    assert "checkpointing at the next step boundary" in capsys.readouterr().out


def test_a_user_error_at_the_start_is_recorded_then_the_processes_stop(monkeypatch):
    attempt, done = _scripted(monkeypatch, phase.START_REFUSED)
    with pytest.raises(RuntimeError, match="refused"):
        attempt._drive(phase.PREPARED)
    assert done == [
        phase.BEGIN,
        phase.START,
        phase.RECORD_USER_ERROR,
        phase.END_PROCESSES,
        phase.GIVE_UP,
        phase.REFUSE,
    ]
    assert attempt.state == phase.FAILED
