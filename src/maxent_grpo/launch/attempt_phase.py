"""An attempt as one state machine: its states, the events that move it and what each
transition does, as data in one pure table (TABLE). launch/attempt.py is the edge: it turns
what happened (a signal, a server lost, the trainers' exit, Slurm's answer) into an event,
looks up (state, event) and carries out the actions (processes, files, signals, Slurm).

The states:

- preparing: the request, the recipe and the run's records are read and checked; nothing
  runs yet (the run's output_dir may not be known).
- starting: the servers start (the reward-model server is waited for), the trainers beside
  them; no hang is called until every server answers.
- training: every server answered; the trainers run, watched (launch/watch.py).
- ending: training ended without a stop being asked (exit, hang, a server lost): what is
  left is stopped (a hang's stacks dumped first) and the end classified.
- stopping: a stop was asked (a signal, submitit, before anything started): the trainers
  save at the next step boundary and exit; the rest of the flow (preparing, starting,
  training, ending) goes on in this state, since a second SIGTERM or SIGINT means "stop
  everything now" wherever the flow is.
- finishing: the outcome is recorded and the job requeued under Slurm (launch/finish.py);
  a signal is only noted (Slurm requeueing the job, or its time limit's warning, which cuts
  the wait for a silent node to be marked down).
- done, requeued, stopped, failed: terminal. The run completed (or already had), the job
  runs again, it stopped and is not requeued here (submitit requeues it), it failed (a
  permanent failure, no requeue left, a refused start). A terminal state has no exits: a
  late signal is noted, a late stop request still written.

Signals: a first stop signal asks for a checkpoint at the next step boundary; a SIGTERM while
Slurm reports a failed node of the job stops the ranks at once (they cannot save without
their peer); in stopping a second SIGTERM or SIGINT stops everything now, SIGUSR1 again is
Slurm's warning repeated (the same request again, a no-op).
"""

from __future__ import annotations

import signal

# States.
PREPARING, STARTING, TRAINING, ENDING = "preparing", "starting", "training", "ending"
STOPPING, FINISHING = "stopping", "finishing"
DONE, REQUEUED, STOPPED, FAILED = "done", "requeued", "stopped", "failed"
TERMINAL = (DONE, REQUEUED, STOPPED, FAILED)
STATES = (PREPARING, STARTING, TRAINING, ENDING, STOPPING, FINISHING, *TERMINAL)

# Events of the flow, named by the edge from what happened.
MARKED_FAILED = "marked_failed"  # an earlier task of this array failed for good
REFUSED = "refused"  # a user error: prepare, the resume check, or the start (given up)
ALREADY_COMPLETE = "already_complete"  # output_dir holds a completed run
PREPARED = "prepared"  # the recipe and plan are checked, the run's records read
SERVERS_UP = "servers_up"  # every server answered /health
TRAINERS_EXITED = "trainers_exited"  # the training command exited (or never started)
HANG = "hang"  # the watchdog found a hang (launch/hang.py)
SERVER_LOST = "server_lost"  # a server of any kind is gone while the trainers ran
START_REFUSED = "start_refused"  # a user error while the servers started (the recipe's)
SERVER_KILLED = "server_killed"  # a server killed while starting: a crash, retried
START_CANCELLED = "start_cancelled"  # a stop signal while waiting for a server's start
CLASSIFIED = "classified"  # every process stopped, the attempt's outcome known
RUN_COMPLETED, JOB_REQUEUED = "run_completed", "job_requeued"  # what finishing did
RUN_STOPPED, RUN_FAILED = "run_stopped", "run_failed"
STOP_ASKED = "stop_asked"  # a graceful stop asked in the process (submitit, early signals)

# Stop signals as events: the signal's name, with "+node_failed" when Slurm reports a
# failed node of the job (asked only where the answer changes the row: asks_about_nodes).
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def signal_event(signum: int, node_failed: bool = False) -> str:
    """The event of a stop signal: SIGTERM, or SIGTERM+node_failed when Slurm reports one."""
    name = signal.Signals(signum).name
    return f"{name}+node_failed" if node_failed else name


SIGNAL_EVENTS = tuple(signal_event(s, f) for s in SIGNALS for f in (False, True))

# Actions, carried out by the edge in the order given.
CHECKPOINT = "checkpoint"  # ask the trainers to save at the next step boundary, then exit
STOP_NOW = "stop_now"  # ask, and stop every process after a second (a failed node)
FORCE = "force"  # stop every process of the run now
NOTE = "note"  # only remember the signal
SAY_MARKED = "say_marked"  # the earlier task's error line; exit code 2
SAY_COMPLETE = "say_complete"  # "already holds a completed run"; exit code 0
REFUSE = "refuse"  # raise the user error (the caller prints its one line)
GIVE_UP = "give_up"  # after a user error at the start: refused, once the processes stopped
BEGIN = "begin"  # clear the last attempt's stop request and heartbeats, record the start
RECORD_STOP = "record_stop"  # write the stop asked before output_dir was known
START = "start"  # start the servers and trainers and watch them (its end is the next event)
RECORD_USER_ERROR = "record_user_error"  # the outcome user_error, before the teardown
END_PROCESSES = "end_processes"  # a hang: stacks, then kill; a stop: let the save end; then all
CLASSIFY = "classify"  # the attempt's class from how training ended (launch/outcomes.py)
CLASSIFY_CRASH = "classify_crash"  # a server killed while starting: a crash
FINISH = "finish"  # record the outcome, requeue or remember a permanent failure

LIVE = (PREPARING, STARTING, TRAINING, ENDING)  # before finishing, no stop asked yet
_TERM, _INT, _USR1 = (signal_event(s) for s in SIGNALS)
_TERM_FAILED = signal_event(signal.SIGTERM, True)


def _signal_rows() -> dict[tuple[str, str], tuple[str, tuple[str, ...]]]:
    rows = {}
    for state in LIVE:
        for event in SIGNAL_EVENTS:
            rows[(state, event)] = (STOPPING, (CHECKPOINT,))
        if state != PREPARING:  # processes run: their peer on a failed node is lost
            rows[(state, _TERM_FAILED)] = (STOPPING, (STOP_NOW,))
    for event in SIGNAL_EVENTS:
        again = CHECKPOINT if event.startswith(_USR1) else FORCE
        rows[(STOPPING, event)] = (STOPPING, (again,))
        for state in (FINISHING, *TERMINAL):
            rows[(state, event)] = (state, (NOTE,))
    for state in STATES:  # a stop asked in the process: recorded wherever the attempt is
        rows[(state, STOP_ASKED)] = (STOPPING if state in LIVE else state, (CHECKPOINT,))
    return rows


def _ended(state: str) -> str:
    """Where the end of training leads: ending, or stopping still when a stop was asked
    (a second SIGTERM or SIGINT still stops everything at once while the save ends)."""
    return STOPPING if state == STOPPING else ENDING


def _flow_rows() -> dict[tuple[str, str], tuple[str, tuple[str, ...]]]:
    rows = {}
    for state in (PREPARING, STOPPING):  # a stop asked while preparing changes only the start
        rows[(state, MARKED_FAILED)] = (FAILED, (SAY_MARKED,))
        rows[(state, REFUSED)] = (FAILED, (REFUSE,))
        rows[(state, ALREADY_COMPLETE)] = (DONE, (SAY_COMPLETE,))
    rows[(PREPARING, PREPARED)] = (STARTING, (BEGIN, START))
    # Asked to stop before anything started: nothing starts; the stop is the outcome.
    rows[(STOPPING, PREPARED)] = (STOPPING, (BEGIN, RECORD_STOP, END_PROCESSES, CLASSIFY))
    rows[(STARTING, SERVERS_UP)] = (TRAINING, ())
    rows[(STOPPING, SERVERS_UP)] = (STOPPING, ())
    for state in (STARTING, STOPPING):  # a server's start failed, or was cancelled
        rows[(state, START_REFUSED)] = (_ended(state), (RECORD_USER_ERROR, END_PROCESSES, GIVE_UP))
        rows[(state, SERVER_KILLED)] = (_ended(state), (END_PROCESSES, CLASSIFY_CRASH))
    rows[(STOPPING, START_CANCELLED)] = (STOPPING, (END_PROCESSES, CLASSIFY))
    for state in (STARTING, TRAINING, STOPPING):
        for event in (TRAINERS_EXITED, SERVER_LOST):
            rows[(state, event)] = (_ended(state), (END_PROCESSES, CLASSIFY))
    for state in (TRAINING, STOPPING):  # no hang is called before every server answered
        rows[(state, HANG)] = (_ended(state), (END_PROCESSES, CLASSIFY))
    rows[(ENDING, REFUSED)] = (FAILED, (REFUSE,))  # (stopping's is preparing's)
    for state in (ENDING, STOPPING):
        rows[(state, CLASSIFIED)] = (FINISHING, (FINISH,))
    rows[(FINISHING, RUN_COMPLETED)] = (DONE, ())
    rows[(FINISHING, JOB_REQUEUED)] = (REQUEUED, ())
    rows[(FINISHING, RUN_STOPPED)] = (STOPPED, ())
    rows[(FINISHING, RUN_FAILED)] = (FAILED, ())
    return rows


# (state, event) -> (next state, actions): every transition of an attempt.
TABLE: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {**_signal_rows(), **_flow_rows()}


def transition(state: str, event: str) -> tuple[str, tuple[str, ...]]:
    """(next state, actions) for `event` in `state`; KeyError: the event cannot happen there."""
    return TABLE[(state, event)]


def asks_about_nodes(state: str, signum: int) -> bool:
    """Whether the row depends on a failed node (the edge then asks Slurm, bounded)."""
    return transition(state, signal_event(signum, True)) != transition(state, signal_event(signum))
