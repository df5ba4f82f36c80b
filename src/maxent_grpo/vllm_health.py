"""The wait for a vLLM server's /health, with a timeout and the server's liveness.

Shared by the launcher (launch/server.py: the server it started) and the trainers
(train/vllm_connect.py: a server started elsewhere), so it sits below both. A `child` is the
server's process as the launcher holds it (launch/processes.py Child: `poll()`, `log_path`,
`log_tail(lines)`), or None.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable

from maxent_grpo.errors import UserError

LOG_TAIL_LINES = 15
# vllm_nodes > 1: every server's base URL, comma-separated, in the trainers' environment (the
# launcher's plan sets it; train/server_pool.py reads it). Server I's NCCL group port is the
# first server's plus I (group_port_of): the plan assigns them, the trainers' pool uses them.
SERVERS_VARIABLE = "MAXENT_GRPO_VLLM_SERVERS"


def group_port_of(first: int, index: int) -> int:
    return first + index


def server_urls(value: str | None) -> tuple[str, ...]:
    """SERVERS_VARIABLE's value -> the base URLs (empty, unset: none)."""
    return tuple(u.strip().rstrip("/") for u in (value or "").split(",") if u.strip())


PROBE_TIMEOUT = 5.0

# No proxy for health probes: the server is on this node or a node of the same job.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServerError(UserError):
    """A server died or never became healthy. `outcome`: the attempt's class for it, a
    user_error (its log says what to fix) unless a signal killed it (the OOM killer, a node's
    end, an operator), which is retried as the raiser says (launch/outcomes.py)."""

    def __init__(self, message: str, outcome: str = "user_error"):
        super().__init__(message)
        self.outcome = outcome


class ServerWaitCancelled(Exception):
    """A stop signal arrived while waiting for the server to become healthy."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum} arrived while waiting for the vLLM server")
        self.signum = signum


def probe(url: str, timeout: float = PROBE_TIMEOUT) -> int | None:
    """HTTP status of GET url, redirects followed (/health/ -> /health); None if no answer."""
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError, ValueError):
        # Refused, reset, timed out, or garbage instead of HTTP: not up (yet).
        return None


def indented_tail(child, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a server's log, each on a line of its own, indented."""
    tail = child.log_tail(lines).strip("\n")
    if not tail:
        return "\n    (the log is empty)"
    return "\n" + "\n".join("    " + line for line in tail.splitlines())


def how_it_ended(code: int) -> str:
    """A server process's exit code in words ("was killed by signal 9", "exited with code 1")."""
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def stopped_note(child) -> str:
    """Why a server never answered when that is a hang, not a slow start: its process is
    stopped (SIGSTOP). '' otherwise, and for child None (a server started elsewhere)."""
    if child is None or not getattr(child, "stopped", lambda: False)():
        return ""
    return f"its process (pid {child.pid}) is stopped (SIGSTOP?), a hang:"


def exit_message(child, code: int, when: str) -> str:
    """One line saying what happened, then the last lines of the server's log."""
    how = how_it_ended(code)
    return f"vLLM server {how} {when}; last lines of {child.log_path}:" + indented_tail(child)


class HealthWait:
    """A server's wait for /health, one `check()` per poll (the caller sleeps between them).

    Starts its clock when created (when the server process starts). A check raises
    ServerError at once when the process exited, or once `timeout` seconds have passed, and
    ServerWaitCancelled when `cancelled()` returns a signal number. child: the server's
    process, or None for a server started elsewhere (the trainers' wait, train/vllm_connect.py).
    """

    def __init__(
        self,
        child,
        url: str,
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.child, self.url, self.timeout, self.clock = child, url, timeout, clock
        self.start = clock()

    def remaining(self) -> float:
        return self.timeout - (self.clock() - self.start)

    def check(self, cancelled: Callable[[], int | None] = lambda: None) -> float | None:
        """The seconds it took once /health answered 200; None while still starting."""
        signum = cancelled()
        if signum:
            raise ServerWaitCancelled(signum)
        code = self.child.poll() if self.child is not None else None
        if code is not None:
            elapsed = self.clock() - self.start
            when = f"{elapsed:.1f}s after start, before it answered {self.url}"
            raise ServerError(
                exit_message(self.child, code, when), "crash" if code < 0 else "user_error"
            )
        last = probe(self.url, timeout=max(0.2, min(PROBE_TIMEOUT, self.remaining())))
        if last == 200:
            return self.clock() - self.start
        if self.remaining() <= 0:
            answer = f"last answer HTTP {last}" if last is not None else "no answer"
            where = "check that a vLLM server runs there"
            if self.child is not None:
                where = f"see the last lines of {self.child.log_path}:" + indented_tail(self.child)
            stopped = stopped_note(self.child)
            why = stopped or "a big model may need a larger vllm_server_timeout, otherwise"
            raise ServerError(
                f"vLLM server not healthy after {self.timeout:g}s (vllm_server_timeout) at "
                f"{self.url} ({answer}); {why} {where}",
                "hang" if stopped else "user_error",
            )
        return None

    def wait(self, poll: float, cancelled: Callable[[], int | None] = lambda: None) -> float:
        """Check every `poll` seconds until healthy; returns the seconds it took."""
        while (took := self.check(cancelled)) is None:
            time.sleep(max(0.0, min(poll, self.remaining())))
        return took
