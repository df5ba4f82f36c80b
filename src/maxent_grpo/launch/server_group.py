"""Several vLLM servers (vllm_nodes > 1), watched as one by the launcher's loop.

A ServerGroup starts one VLLMServer per server of the plan (the first node's directly, the
others through their srun step, plan/server.py), and answers the loop (launch/watch.py
watch_training) as one server does (launch/watch.py Server): `check_started` is True once every
server answered /health; `lost` is None while any server runs or can still be restarted. A server
that exits while training runs is restarted in place, at most MAX_RESTARTS times per server,
each start in a log of its own; `server_lost` and `server_back` events record it (the
trainers' pool, train/server_pool.py, sends its requests to the others meanwhile and gives it
the current weights before it takes requests again). Only when no server is left does the
run stop, as with one server.

A server whose node Slurm marks down or not responding (its network cut, its power lost) is
not restarted: a step cannot start there and srun would wait for it. It is lost for good and
the run goes on with the others (a job submitted with --no-kill outlives the node: `maxent-grpo
sbatch` asks for it when the plan has several servers, launch/sbatch.py).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from maxent_grpo.launch.plan import ServerPlan
from maxent_grpo.launch.server import VLLMServer
from maxent_grpo.launch.slurm import node_down
from maxent_grpo.launch.stacks import dump_server_stacks
from maxent_grpo.vllm_health import ServerError, probe

# Restarts of one server within one attempt (each a full vLLM start: model load, warm-up).
MAX_RESTARTS = 3
# A running server's /health is asked every HEALTH_EVERY_S; one that has not answered 200 for
# SILENT_LOST_S is lost too (stopped, then restarted). Why not wait for its exit: an srun step
# whose API server was killed outlives it while vLLM's engine process holds its output open.
HEALTH_EVERY_S = 5.0
SILENT_LOST_S = 30.0
HEALTH_PROBE_S = 2.0  # each probe's own bound: the launcher's loop waits for it
NODE_STATE_S = 5.0  # scontrol's bound, asked on a loss and every HEALTH_EVERY_S of a restart
# A restart that exits before it answers (srun could not start it: its node may be cut, and
# Slurm marks such a node down only after SlurmdTimeout) is tried again after this long, its
# node's state asked meanwhile: restarts in a row would spend MAX_RESTARTS in seconds on a
# node Slurm is about to report down.
RETRY_AFTER_S = 30.0


def _no_event(event: str, **fields) -> None:
    return None


class ServerGroup:
    """The plan's servers: started together, watched, each restarted in place when lost; one
    launch/watch.py Server to the loop."""

    name = VLLMServer.name
    without = VLLMServer.without
    lost_as = VLLMServer.lost_as

    def __init__(
        self,
        plans: tuple[ServerPlan, ...],
        log_path: Path,
        environ: Mapping[str, str] = os.environ,
        event: Callable[..., None] = _no_event,
    ):
        self.log_path = Path(log_path)  # the first server's log (the hang path's stacks)
        self.servers = [VLLMServer(p, self._log(i, 0), environ) for i, p in enumerate(plans)]
        self.restarts = [0] * len(plans)
        self.answered = [time.monotonic()] * len(plans)  # last /health 200, per server
        self.next_probe = [0.0] * len(plans)
        self.lost_at: dict[int, float] = {}  # index -> when it was found gone
        self.retry: dict[int, tuple[float, str]] = {}  # index -> (next restart at, why)
        self.gone: dict[int, str] = {}  # index -> why it is lost for good
        self.event = event
        self.slurm = bool(environ.get("SLURM_JOB_ID"))  # node states to ask Slurm for
        self.healthy_after: float | None = None  # every server answered, seconds from start
        self._start = time.monotonic()

    @property
    def hang_urls(self) -> tuple[str, ...]:
        """The /health of every server (the run can generate while any answers, launch/hang.py)."""
        return tuple(url for server in self.servers for url in server.hang_urls)

    def _log(self, index: int, restart: int) -> Path:
        """Server 0 keeps the run's vLLM log name; the others (and restarts) get their own."""
        suffix = (f"-server{index}" if index else "") + (f"-restart{restart}" if restart else "")
        return self.log_path.with_name(f"{self.log_path.stem}{suffix}{self.log_path.suffix}")

    def start(self) -> ServerGroup:
        for server in self.servers:
            server.start()
            print(
                f"vLLM server on {server.plan.node} starting (pid {server.pid}); log: "
                f"{server.log_path}",
                flush=True,
            )
        return self

    def running(self) -> list[VLLMServer]:
        return [s for s in self.servers if s.child is not None and s.poll() is None]

    def check_started(self, cancelled: Callable[[], int | None] = lambda: None) -> bool:
        """One poll of the start-up: True once every server answered /health; raises
        ServerError (naming the server) when one exits or times out first."""
        if self.healthy_after is None:
            if not all([s.check_started(cancelled) for s in self.servers]):
                return False
            self.healthy_after = time.monotonic() - self._start
            self.answered = [time.monotonic()] * len(self.servers)  # silence counts from here
        return True

    def died_message(self) -> str | None:
        """None while a server runs or comes back; restarts the ones that exited or went
        silent (bounded). Nothing before every server started: check_started watches that."""
        if self.healthy_after is None:
            return None
        for index, server in enumerate(self.servers):
            if index in self.gone:
                continue
            if index in self.retry:
                self._wait_retry(index, server)
            elif index in self.lost_at:
                self._watch_restart(index, server)
            elif server.poll() is not None:
                self._lost(index, server, f"exited with code {server.poll()}")
            elif self._silent_s(index, server) > SILENT_LOST_S:
                server.stop(grace=5)
                silent = f"did not answer {server.plan.health_url} for {SILENT_LOST_S:g}s"
                self._lost(index, server, silent)
        if len(self.gone) == len(self.servers):
            return "every vLLM server is lost: " + "; ".join(self.gone.values())
        return None

    def _silent_s(self, index: int, server: VLLMServer) -> float:
        """Seconds since the server last answered /health 200 (probed every HEALTH_EVERY_S)."""
        now = time.monotonic()
        if now >= self.next_probe[index]:
            self.next_probe[index] = now + HEALTH_EVERY_S
            if probe(server.plan.health_url, timeout=HEALTH_PROBE_S) == 200:
                self.answered[index] = time.monotonic()
        return time.monotonic() - self.answered[index]

    def _lost(self, index: int, server: VLLMServer, why: str) -> None:
        node = server.plan.node
        self.lost_at[index] = time.monotonic()
        self.next_probe[index] = 0.0  # a restart's first watch asks for its node's state
        self.event("server_lost", node=node, url=server.plan.url, reason=why)
        state = self._node_down(node)
        if state is not None or self.restarts[index] >= MAX_RESTARTS:
            self._give_up(index, server, why, state)
            return
        self.restarts[index] += 1
        log = self._log(index, self.restarts[index])
        print(
            f"vLLM server on {node} {why}: restart {self.restarts[index]}/{MAX_RESTARTS}, "
            f"log: {log}",
            flush=True,
        )
        fresh = VLLMServer(server.plan, log, server.env)
        self.servers[index] = fresh.start()

    def _node_down(self, node: str) -> str | None:
        return node_down(node, timeout=NODE_STATE_S) if self.slurm else None

    def _give_up(self, index: int, server: VLLMServer, why: str, state: str | None) -> None:
        """Lost for good: no restart left, or its node is down (state: Slurm's word)."""
        node = server.plan.node
        if state is not None:
            server.stop(grace=5)  # a restart that was under way there
            self.gone[index] = f"{node}: {why}; Slurm has the node {state}: not restarted"
            print(
                f"vLLM server on {node} {why}; Slurm has the node {state}: not restarted",
                flush=True,
            )
        else:
            self.gone[index] = f"{node}: {why}, after {MAX_RESTARTS} restarts"
            print(f"vLLM server on {node} {why}; no restart left", flush=True)
        self.gone[index] += f" (log {server.log_path})"

    def _watch_restart(self, index: int, server: VLLMServer) -> None:
        now = time.monotonic()
        if now >= self.next_probe[index]:  # its node went down after the restart began
            self.next_probe[index] = now + HEALTH_EVERY_S
            if (state := self._node_down(server.plan.node)) is not None:
                self._give_up(index, server, "restart abandoned", state)
                return
        try:
            if not server.check_started():
                return
        except ServerError as exc:
            del self.lost_at[index]
            why = f"did not come back ({str(exc).splitlines()[0]})"
            self.retry[index] = (time.monotonic() + RETRY_AFTER_S, why)
            print(
                f"vLLM server on {server.plan.node} {why}: next restart in {RETRY_AFTER_S:g}s",
                flush=True,
            )
            return
        took = time.monotonic() - self.lost_at.pop(index)
        self.answered[index] = time.monotonic()
        self.event(
            "server_back", node=server.plan.node, url=server.plan.url, after_s=round(took, 1)
        )

    def _wait_retry(self, index: int, server: VLLMServer) -> None:
        """Between a failed restart and the next: given up if Slurm reports the node down."""
        retry_at, why = self.retry[index]
        now = time.monotonic()
        if now >= self.next_probe[index]:
            self.next_probe[index] = now + HEALTH_EVERY_S
            if (state := self._node_down(server.plan.node)) is not None:
                del self.retry[index]
                self._give_up(index, server, why, state)
                return
        if now >= retry_at:
            del self.retry[index]
            self._lost(index, server, why)

    def lost(self, stopping: bool, exited: bool) -> str | None:
        """Like one server's: while the trainers run, a stop signal does not excuse it."""
        return None if exited else self.died_message()

    def members(self) -> list[int]:
        """The running servers' processes (what the hang path signals and dumps)."""
        return [pid for s in self.running() for pid in s.child.members()]

    def remember(self) -> None:
        self.members()

    def dump_stacks(self, note: Callable[[str], None]) -> None:
        if members := self.members():
            dump_server_stacks(members, self.log_path, note)

    def kill(self) -> None:
        for server in self.running():
            server.child.signal(signal.SIGKILL)

    def poll(self) -> int | None:
        """Like one server's: an exit code only once every server is lost for good."""
        return None if len(self.gone) < len(self.servers) else 1

    def stop(self, grace: float = 10.0) -> None:
        for server in self.servers:
            server.stop(grace=grace)


def launch_servers(
    plans: tuple[ServerPlan, ...],
    log_path: Path,
    environ: Mapping[str, str],
    event: Callable[..., None] = _no_event,
) -> ServerGroup:
    """Start every server without waiting (the loop watches their start-up)."""
    return ServerGroup(plans, log_path, environ, event).start()
