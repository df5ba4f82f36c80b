"""The reward-model server of a run (reward_model_gpus): started, waited for, always stopped.

Started before the vLLM server (which boots meanwhile) and waited for before the trainers
start (/health 200 within vllm_server_timeout, the process alive), so their first scoring
finds it up: their reward-server client retries only within reward_server_retries, far less
than a model's load. A server that exits or does not answer in time stops the attempt with one
line and the end of its log, before any trainer starts. It is stopped with the rest of the run
(Attempt.abort).

Mid-run it is watched (launch/watch.py watch_training, each poll): a server that exits while
training runs stops the trainers at once and ends the attempt as `reward_server_lost`, one line
naming the server and its log. It is not restarted in place as a vLLM server is: the trainers'
bounded retries give up on a refused connection within seconds (reward_server_retries pauses of
0.5-5 s), far less than a model's load, so a restart would come after the step had failed
anyway; a requeue restarts it with the run, from the last complete checkpoint.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from maxent_grpo.faults import failpoint
from maxent_grpo.launch.plan import RewardModelPlan
from maxent_grpo.launch.processes import Child, server_child
from maxent_grpo.vllm_health import (
    ServerError,
    ServerWaitCancelled,
    how_it_ended,
    indented_tail,
    probe,
    stopped_note,
)

POLL_SECONDS = 0.5


class RewardModelServer:
    """The server process of a RewardModelPlan: `start()`, `wait_until_healthy()`, `stop()`;
    a launch/watch.py Server (healthy before the trainers start)."""

    name = "reward model server"
    without = "it cannot score without the reward model server"
    lost_as = "reward_server_died"
    hang_urls = ()  # a silent server fails its clients' bounded retries: their crash says it

    def __init__(self, plan: RewardModelPlan, log_path: Path, environ: Mapping[str, str]):
        self.plan, self.log_path = plan, Path(log_path)
        self.env = {**environ, **plan.env, "PYTHONUNBUFFERED": "1"}
        self.child: Child | None = None

    def start(self) -> RewardModelServer:
        self.child = server_child("reward_model", self.plan.command, self.log_path, self.env)
        print(
            f"reward model server starting (pid {self.child.pid}); log: {self.log_path}", flush=True
        )
        failpoint("server_start")
        return self

    def wait_until_healthy(
        self,
        cancelled: Callable[[], int | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> float:
        """Seconds until /health answered 200; ServerError when the process exits first or
        `timeout` passes, ServerWaitCancelled when `cancelled()` gives a signal number."""
        assert self.child is not None
        start, plan = clock(), self.plan
        while True:
            if signum := cancelled():
                raise ServerWaitCancelled(signum)
            code = self.child.poll()
            if code is not None:
                raise ServerError(
                    f"reward model server {how_it_ended(code)} before it answered "
                    f"{plan.health_url}; last lines of {self.log_path}:"
                    + indented_tail(self.child),
                    "reward_server_lost" if code < 0 else "user_error",
                )
            if probe(plan.health_url, timeout=2.0) == 200:
                took = clock() - start
                print(f"reward model server healthy after {took:.1f}s at {plan.url}", flush=True)
                return took
            if clock() - start > plan.timeout:
                stopped = stopped_note(self.child)
                why = stopped or "a big model may need a larger vllm_server_timeout, otherwise"
                raise ServerError(
                    f"reward model server not healthy after {plan.timeout:g}s "
                    f"(vllm_server_timeout) at {plan.health_url}; {why} see {self.log_path}:"
                    + indented_tail(self.child),
                    "hang" if stopped else "user_error",
                )
            time.sleep(POLL_SECONDS)

    def died_message(self) -> str | None:
        """Why the server is gone, one line naming it and its log, then its log's end; None
        while it runs (or before it started)."""
        code = self.child.poll() if self.child is not None else None
        if code is None:
            return None
        server = f"reward model server {self.plan.url} (model {self.plan.model})"
        return (
            f"{server} {how_it_ended(code)} while training ran; its log: {self.log_path}\n"
            "  last lines:" + indented_tail(self.child)
        )

    def check_started(self, cancelled: Callable[[], int | None] = lambda: None) -> bool:
        return True  # waited for before the trainers started (wait_until_healthy)

    def lost(self, stopping: bool, exited: bool) -> str | None:
        """Why it is gone, also once the trainers exited: their next scoring fails within
        seconds of the loss (RewardServerDown), often before a poll saw the server go. None
        after a stop signal (a preemption's SIGTERM reaches every process of the job: the
        trainers are saving)."""
        return None if stopping else self.died_message()

    def remember(self) -> None:
        if self.child is not None:
            self.child.members()

    def dump_stacks(self, note: Callable[[str], None]) -> None:
        """Not dumped: it runs without PYTHONFAULTHANDLER, so SIGABRT would only kill it."""

    def kill(self) -> None:
        if self.child is not None:
            self.child.signal(signal.SIGKILL)

    def stop(self, grace: float = 10.0) -> int | None:
        if self.child is None:
            return None
        running = self.child.poll() is None
        code = self.child.stop(grace=grace)
        if running:
            print("reward model server stopped", flush=True)
        return code
