"""An attempt's phases and what a stop signal does in each: one pure table, which
launch/attempt.py acts on (the stop request, the processes, the note of a late signal).

    running    training (or the servers' start) goes on: the first stop signal asks for a
               checkpoint at the next step boundary; a SIGTERM while Slurm reports a failed
               node of the job stops the ranks at once (they cannot save without their peer)
    stopping   a stop was asked: a second SIGTERM or SIGINT stops everything now; SIGUSR1
               again is Slurm's warning repeated, the same request again (a no-op)
    finishing  training is over and the outcome is being recorded: a signal is only noted
               (Slurm requeueing the job, or its time limit's warning, which cuts the wait for
               a silent node to be marked down)
"""

from __future__ import annotations

import signal

RUNNING, STOPPING, FINISHING = "running", "stopping", "finishing"

CHECKPOINT = "checkpoint"  # ask the trainers to save at the next step boundary, then exit
STOP_NOW = "stop_now"  # ask, and stop every process after a second (a failed node)
FORCE = "force"  # stop every process of the run now
NOTE = "note"  # only remember the signal

# (phase, signal, a failed node reported) -> (action, next phase)
_TERM, _INT, _USR1 = signal.SIGTERM, signal.SIGINT, signal.SIGUSR1
TABLE: dict[tuple[str, int, bool], tuple[str, str]] = {
    **{(RUNNING, s, False): (CHECKPOINT, STOPPING) for s in (_TERM, _INT, _USR1)},
    (RUNNING, _TERM, True): (STOP_NOW, STOPPING),
    **{(RUNNING, s, True): (CHECKPOINT, STOPPING) for s in (_INT, _USR1)},
    **{(STOPPING, s, f): (FORCE, STOPPING) for s in (_TERM, _INT) for f in (False, True)},
    **{(STOPPING, _USR1, f): (CHECKPOINT, STOPPING) for f in (False, True)},
    **{(FINISHING, s, f): (NOTE, FINISHING) for s in (_TERM, _INT, _USR1) for f in (False, True)},
}


def asks_about_nodes(phase: str, signum: int) -> bool:
    """Whether the action depends on a failed node (the edge then asks Slurm, bounded)."""
    return TABLE[(phase, signum, True)] != TABLE[(phase, signum, False)]


def on_signal(phase: str, signum: int, node_failed: bool = False) -> tuple[str, str]:
    """(action, next phase) for a stop signal in `phase`."""
    return TABLE[(phase, signum, node_failed)]
