"""The vLLM server of a run: started in its own process group, checked, always stopped.

The launcher starts the server the plan describes (plan.ServerPlan) and the trainers beside
it: the trainers load the model and data while the server boots, and their first generation
waits for /health (train/vllm_connect.py). The launcher's loop (launch/watchdog.py
watch_training) checks the start-up at every poll: a server that exits before it answers
/health, or does not answer 200 within vllm_server_timeout, stops everything and is
reported in seconds with the end of its log. The server is stopped (the whole process group:
the API server and vLLM's engine processes) whatever happens to training."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from maxent_grpo.errors import UserError
from maxent_grpo.launch.plan import ServerPlan
from maxent_grpo.launch.processes import Child

LOG_TAIL_LINES = 15
POLL_SECONDS = 1.0
PROBE_TIMEOUT = 5.0

# No proxy for health probes: the server is on this node or a node of the same job.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServerError(UserError):
    """The vLLM server died or never became healthy."""


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


def _indented_tail(child: Child, lines: int = LOG_TAIL_LINES) -> str:
    tail = child.log_tail(lines).strip("\n")
    if not tail:
        return "\n    (the log is empty)"
    return "\n" + "\n".join("    " + line for line in tail.splitlines())


def exit_message(child: Child, code: int, when: str) -> str:
    """One line saying what happened, then the last lines of the server's log."""
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return f"vLLM server {how} {when}; last lines of {child.log_path}:" + _indented_tail(child)


class HealthWait:
    """A server's wait for /health, one `check()` per poll (the caller sleeps between them).

    Starts its clock when created (when the server process starts). A check raises
    ServerError at once when the process exited, or once `timeout` seconds have passed, and
    ServerWaitCancelled when `cancelled()` returns a signal number. child: the server's
    process, or None for a server started elsewhere (the trainers' wait, train/vllm_connect.py).
    """

    def __init__(
        self,
        child: Child | None,
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
            raise ServerError(exit_message(self.child, code, when))
        last = probe(self.url, timeout=max(0.2, min(PROBE_TIMEOUT, self.remaining())))
        if last == 200:
            return self.clock() - self.start
        if self.remaining() <= 0:
            answer = f"last answer HTTP {last}" if last is not None else "no answer"
            where = "check that a vLLM server runs there"
            if self.child is not None:
                where = f"see the last lines of {self.child.log_path}:" + _indented_tail(self.child)
            raise ServerError(
                f"vLLM server not healthy after {self.timeout:g}s (vllm_server_timeout) at "
                f"{self.url} ({answer}); a big model may need a larger vllm_server_timeout, "
                f"otherwise {where}"
            )
        return None

    def wait(self, poll: float, cancelled: Callable[[], int | None] = lambda: None) -> float:
        """Check every `poll` seconds until healthy; returns the seconds it took."""
        while (took := self.check(cancelled)) is None:
            time.sleep(max(0.0, min(poll, self.remaining())))
        return took


class VLLMServer:
    """The server process of a plan: `start()`, `wait_until_healthy()` or `check_started()`
    at each poll of the launcher's loop, `stop()`."""

    def __init__(self, plan: ServerPlan, log_path: Path, environ: Mapping[str, str] = os.environ):
        self.plan = plan
        self.log_path = Path(log_path)
        self.env = {**environ, **plan.env, "PYTHONUNBUFFERED": "1"}
        self.child: Child | None = None
        self.health: HealthWait | None = None
        self.healthy_after: float | None = None  # seconds from start to /health 200

    def start(self) -> VLLMServer:
        self.child = Child("vllm", self.plan.command, self.log_path, env=self.env)
        self.health = HealthWait(self.child, self.plan.health_url, self.plan.timeout)
        return self

    @property
    def pid(self) -> int:
        assert self.child is not None
        return self.child.pid

    def wait_until_healthy(
        self, poll: float = POLL_SECONDS, cancelled: Callable[[], int | None] = lambda: None
    ) -> float:
        assert self.health is not None
        self._healthy(self.health.wait(poll, cancelled))
        return self.healthy_after

    def check_started(self, cancelled: Callable[[], int | None] = lambda: None) -> bool:
        """One poll of the start-up: True once healthy; raises like HealthWait.check."""
        if self.healthy_after is None:
            assert self.health is not None
            took = self.health.check(cancelled)
            if took is None:
                return False
            self._healthy(took)
        return True

    def _healthy(self, took: float) -> None:
        self.healthy_after = took
        print(f"vLLM server healthy after {took:.1f}s at {self.plan.url}", flush=True)

    def poll(self) -> int | None:
        return self.child.poll() if self.child is not None else None

    def died_message(self) -> str | None:
        """Why the server is gone (with its log tail), or None while it runs."""
        code = self.poll()
        if code is None or self.child is None:
            return None
        return exit_message(self.child, code, "while training ran")

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the server's process group, SIGKILL what is left after `grace` seconds."""
        if self.child is None:
            return None
        running = self.child.poll() is None
        start = time.monotonic()
        code = self.child.stop(grace=grace)
        if running:
            print(f"vLLM server stopped in {time.monotonic() - start:.1f}s", flush=True)
        return code

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def launch_server(
    plan: ServerPlan, log_path: Path, environ: Mapping[str, str] = os.environ
) -> VLLMServer:
    """Start the server without waiting: the launcher's loop watches its start-up
    (launch/watchdog.py watch_training) while the trainers start beside it."""
    # Whether vLLM is installed was checked before (launch/requirements.py, in prepare()).
    server = VLLMServer(plan, log_path, environ).start()
    print(f"vLLM server starting (pid {server.pid}); log: {log_path}", flush=True)
    return server
