"""The launcher's wait for training: the trainers, every server of the run, hangs, crashes.

A server of any kind (launch/server.py's vLLM server, launch/server_group.py's servers of
vllm_nodes > 1, launch/reward_server.py's reward-model server) is watched through one
interface, `Server`: the loop asks each the same questions and has no branch for a kind, and
the watchdog probes the /health URLs each names as its own (`hang_urls`).
What a kind's loss means (which outcome field, whether a stop signal excuses it) is the
kind's own answer to `lost`. The hang policy is launch/hang.py, its probing
launch/watchdog.py, the stack dumps launch/stacks.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from maxent_grpo.errors import UserError
from maxent_grpo.launch.hang import Hang
from maxent_grpo.launch.watchdog import Watchdog
from maxent_grpo.vllm_health import ServerError, ServerWaitCancelled

# The trainers' grace after SIGTERM when the server's start-up failed or was cancelled.
STARTUP_STOP_GRACE_S = 3.0
# After a trainer reported its exception, the others get this long to exit by themselves
# (torchrun's agent stops them) before the launcher stops them; the environment may change it.
CRASH_GRACE_S = 30.0
CRASH_GRACE_ENV = "MAXENT_GRPO_CRASH_GRACE_S"


class Server(Protocol):
    """What the launcher's loop, the hang path and the attempt need of a server."""

    name: str  # how the stop lines name it: "vLLM server"
    without: str  # why training stops when it is lost: "it cannot generate without the server"
    lost_as: str  # the Watched field that carries its loss
    # The /health URLs whose silence is a hang (launch/watchdog.py probes them, launch/hang.py
    # judges): a vLLM server's; none for the reward-model server, whose clients' bounded
    # retries fail the step within seconds of its silence.
    hang_urls: tuple[str, ...]

    def remember(self) -> None:
        """Look at the process trees (a child remembers every process it saw)."""

    def check_started(self, cancelled: Callable[[], int | None]) -> bool:
        """One poll of the start-up: True once it answers; raises ServerError when it cannot
        start, ServerWaitCancelled when `cancelled()` gives a signal."""

    def lost(self, stopping: bool, exited: bool) -> str | None:
        """Why it is gone (one line, then its log's end), or None. stopping: a stop signal
        came; exited: the trainers exited already."""

    def dump_stacks(self, note: Callable[[str], None]) -> None: ...

    def kill(self) -> None: ...

    def stop(self, grace: float = 10.0) -> int | None: ...


def crash_grace_s(environ) -> float:
    """CRASH_GRACE_S, or MAXENT_GRPO_CRASH_GRACE_S when set (seconds > 0)."""
    value = environ.get(CRASH_GRACE_ENV)
    if value is None:
        return CRASH_GRACE_S
    try:
        grace = float(value)
    except ValueError:
        grace = 0.0
    if not 0 < grace < float("inf"):
        raise UserError(
            f"environment: {CRASH_GRACE_ENV}={value!r} is not a number of seconds > 0; "
            f"set e.g. {CRASH_GRACE_ENV}=60, or unset it for {CRASH_GRACE_S:g}"
        )
    return grace


@dataclass(frozen=True)
class Watched:
    """How the wait for training ended."""

    code: int | None  # the training command's exit code (None: stopped for a hang)
    hang: Hang | None = None
    server_died: str | None = None  # why the server is gone (with its log tail)
    reward_server_died: str | None = None  # why the reward-model server is gone (same)


def watch_training(
    trainer,
    servers: Sequence[Server],
    watchdog: Watchdog | None,
    poll: float = 1.0,
    cancelled: Callable[[], int | None] = lambda: None,
    crash_grace: float = CRASH_GRACE_S,
    on_started: Callable[[], object] = lambda: None,
) -> Watched:
    """Wait for training to exit, watching the servers' start-up, hangs, lost servers and
    crashed ranks.

    trainer: a processes.Child; servers: started with (or, the reward-model server, before)
    the trainers. Until every server answers, their start-up is checked each poll (no hang is
    called: the trainers may be waiting for them); a server that cannot start stops training
    and raises ServerError, a stop signal (`cancelled()`) stops training and raises
    ServerWaitCancelled. After that, a lost server stops training at once; a hang returns at
    once (the caller dumps stacks and stops everything); ranks that outlive a crashed one
    `crash_grace` s are stopped. on_started: called once, when every server answered.
    """
    crashed_at, started = None, False
    while trainer.poll() is None:
        trainer.members()  # stopping the trainers must reach workers that left the group
        for server in servers:
            server.remember()
        if not started:
            started = _started(trainer, servers, watchdog, cancelled)
            if started:
                on_started()
        lost = _lost(servers, cancelled() is not None, exited=False)
        if lost is not None:
            server, message = lost
            print(f"error: {message}", flush=True)
            print(f"stopping training: {server.without}", flush=True)
            trainer.stop()
            return Watched(trainer.wait(), **{server.lost_as: message})
        if watchdog is not None:
            hang = watchdog.poll() if started else None
            if hang is not None:
                return Watched(None, hang=hang)
            if crashed_at is None and watchdog.exit_reports():
                crashed_at = time.monotonic()
            if crashed_at is not None and time.monotonic() - crashed_at > crash_grace:
                print("a training process failed and the others did not exit: stopping them")
                trainer.stop(grace=5)
        trainer.wait_up_to(poll)
    code = trainer.wait()
    # The trainers may have failed on a lost server before a poll here saw it go.
    lost = _lost(servers, cancelled() is not None, exited=True)
    return Watched(code, **({lost[0].lost_as: lost[1]} if lost else {}))


def _lost(servers: Sequence[Server], stopping: bool, exited: bool) -> tuple[Server, str] | None:
    for server in servers:
        message = server.lost(stopping, exited)
        if message is not None:
            return server, message
    return None


def _started(trainer, servers: Sequence[Server], watchdog: Watchdog | None, cancelled) -> bool:
    """Whether every server answers (each is polled); stops training when a start-up failed
    or was cancelled. The watchdog's clocks start when every server answers."""
    ready = True
    for server in servers:
        try:
            ready = server.check_started(cancelled) and ready
        except (ServerError, ServerWaitCancelled) as exc:
            if isinstance(exc, ServerError):
                print(f"stopping training: the {server.name} did not start", flush=True)
            # No step can run before the servers answer: nothing to save, a short grace.
            trainer.stop(grace=STARTUP_STOP_GRACE_S)
            raise
    if ready and watchdog is not None and servers:
        watchdog.restart_clocks()
    return ready
