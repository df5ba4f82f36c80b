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
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from maxent_grpo.faults import failpoint
from maxent_grpo.launch.plan import ServerPlan
from maxent_grpo.launch.processes import Child, server_child
from maxent_grpo.launch.stacks import dump_server_stacks
from maxent_grpo.vllm_health import (
    HealthWait,
    exit_message,
)

POLL_SECONDS = 1.0
# vLLM 0.31's API server logs this line when a signal starts its shutdown
# (vllm/entrypoints/launchers/launcher.py); its engine stops, then uvicorn waits, without a
# bound, for the open connections to close: the trainers' request, which waits for the server.
OWN_SHUTDOWN = b"[shutdown] API server: shutdown triggered"
# Seconds a server may live on after it logged its own shutdown (idle, it exits within ~2 s);
# then it is wedged and killed, and its loss stops training at once instead of the hang
# watchdog's hang_timeout later (bench/chaos.py, seed 1837981534: 600 s for nothing).
SHUTDOWN_BOUND_S = 30.0


class VLLMServer:
    """The server process of a plan: `start()`, `wait_until_healthy()` or `check_started()`
    at each poll of the launcher's loop, `stop()`; a launch/watch.py Server."""

    name = "vLLM server"
    without = "it cannot generate without the server"
    lost_as = "server_died"

    def __init__(self, plan: ServerPlan, log_path: Path, environ: Mapping[str, str] = os.environ):
        self.plan = plan
        self.log_path = Path(log_path)
        self.env = {**environ, **plan.env, "PYTHONUNBUFFERED": "1"}
        self.child: Child | None = None
        self.health: HealthWait | None = None
        self.healthy_after: float | None = None  # seconds from start to /health 200
        self._log_start = self._log_read = 0  # this start's output in the (appended) log
        self.shutdown_seen: float | None = None  # when the log said so (monotonic)

    def start(self) -> VLLMServer:
        try:  # the log is appended across attempts: only this start's output is read
            self._log_start = self._log_read = self.log_path.stat().st_size
        except OSError:
            self._log_start = self._log_read = 0
        self.child = server_child("vllm", self.plan.command, self.log_path, self.env)
        self.health = HealthWait(self.child, self.plan.health_url, self.plan.timeout)
        failpoint("server_start")
        return self

    @property
    def hang_urls(self) -> tuple[str, ...]:
        """The /health URL whose silence past the limit is a hang (launch/hang.py)."""
        return (self.plan.health_url,)

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
        """Why the server is gone (with its log tail), or None while it runs. A server that
        logged its own shutdown and still runs SHUTDOWN_BOUND_S later is killed: gone."""
        code = self.poll()
        if self.child is None:
            return None
        wedged = code is None and self._wedged()
        if wedged:
            self.kill()
            code = self.child.wait_up_to(10)
            code = -signal.SIGKILL if code is None else code
        if code is None:
            return None
        message = exit_message(self.child, code, "while training ran")
        if wedged:
            note = (
                f"while training ran (killed: it logged its own shutdown, "
                f"'{OWN_SHUTDOWN.decode()}', and still ran {SHUTDOWN_BOUND_S:g}s later, "
                "waiting for an open request)"
            )
            message = message.replace("while training ran", note, 1)
        return message

    def _wedged(self) -> bool:
        """Whether the log said the server shuts down, over SHUTDOWN_BOUND_S ago."""
        if self.shutdown_seen is None:
            try:
                with open(self.log_path, "rb") as log:
                    # From a little before where the last read ended: a line cut in two.
                    start = max(self._log_read - len(OWN_SHUTDOWN), self._log_start)
                    log.seek(start)
                    new = log.read()
            except OSError:
                return False
            self._log_read = start + len(new)
            if OWN_SHUTDOWN in new:
                self.shutdown_seen = time.monotonic()
            return False
        return time.monotonic() - self.shutdown_seen > SHUTDOWN_BOUND_S

    def lost(self, stopping: bool, exited: bool) -> str | None:
        """Why it is gone, while the trainers run (a stop signal does not excuse it)."""
        return None if exited else self.died_message()

    def remember(self) -> None:
        if self.child is not None:
            self.child.members()

    def dump_stacks(self, note: Callable[[str], None]) -> None:
        members = self.child.members() if self.child is not None else []
        if members:
            dump_server_stacks(members, self.log_path, note)

    def kill(self) -> None:
        if self.child is not None:
            self.child.signal(signal.SIGKILL)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGINT the server's process group (SIGTERM through srun), SIGKILL what is left after
        `grace` seconds."""
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
    (launch/watch.py watch_training) while the trainers start beside it."""
    # Whether vLLM is installed was checked before (launch/requirements.py, in prepare()).
    server = VLLMServer(plan, log_path, environ).start()
    print(f"vLLM server starting (pid {server.pid}); log: {log_path}", flush=True)
    return server
