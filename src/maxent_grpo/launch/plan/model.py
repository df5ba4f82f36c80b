"""What a plan is made of: the allocation (Environment, Ports) in, the Plan out."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from maxent_grpo.errors import UserError
from maxent_grpo.vllm_health import SERVERS_VARIABLE

ROUTING = (
    f"in the trainers (train/server_pool.py, addresses in {SERVERS_VARIABLE}): each request "
    "spread by outstanding work, weights synced to every server"
)


class PlanError(UserError):
    """The allocation cannot run the recipe (e.g. too few GPUs)."""


@dataclass(frozen=True)
class Environment:
    """What the job was given. gpus are the ids visible on each node (CUDA_VISIBLE_DEVICES)."""

    gpus: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ("localhost",)
    cpu_processes: int = 2  # training processes when there is no GPU
    python: str = "python"
    cpus: int | None = None  # CPUs per node given to the job (None: unknown)


@dataclass(frozen=True)
class Ports:
    """Ports picked at the edge by asking the OS: fixed numbers clash on shared nodes."""

    vllm: int = 8000
    vllm_group: int = 51216
    main_process: int = 29500
    reward_model: int = 8001  # the reward-model server (reward_model_gpus)


@dataclass(frozen=True)
class ServerPlan:
    node: str
    gpus: tuple[str, ...]
    port: int
    group_port: int
    command: tuple[str, ...]
    env: dict[str, str]
    device: str  # "gpu" or "cpu" (vllm_server_device)
    weight_sync: str  # vllm_weight_sync
    timeout: float  # seconds to wait for /health (vllm_server_timeout)
    tensor_parallel: int = 1
    data_parallel: int = 1  # replicas (vLLM's --data-parallel-size)
    data_parallel_why: str = ""  # which key or rule chose them (plan/server.py)
    # The address it binds and its clients use (bind_address): loopback when the trainers
    # share its node, the node's own address otherwise; never every interface.
    host: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.host or self.node}:{self.port}"

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"


@dataclass(frozen=True)
class RewardModelPlan:
    """The reward-model server (reward_model_gpus): rewards/model_server.py on its GPUs."""

    node: str
    gpus: tuple[str, ...]  # empty: on CPU (no GPU in the allocation)
    port: int
    model: str  # the recipe's model: entry, without the prefix
    command: tuple[str, ...]
    env: dict[str, str]
    timeout: float  # seconds to wait for /health (vllm_server_timeout)
    host: str = ""  # the address it binds and the trainers use (plan/server.py bind_address)

    @property
    def url(self) -> str:
        return f"http://{self.host or self.node}:{self.port}/score"

    @property
    def health_url(self) -> str:
        return f"http://{self.host or self.node}:{self.port}/health"

    def describe(self) -> list[str]:
        where = f"GPUs {','.join(self.gpus)}, a model copy each" if self.gpus else "CPU"
        return [
            f"reward model server: node {self.node}, {where} (reward_model_gpus), "
            f"port {self.port}, model {self.model}",
            f"  health: {self.health_url} (timeout {self.timeout:g}s: vllm_server_timeout)",
            f"  trainers score model:{self.model} through {self.url}",
            "  env: " + _format_env(self.env),
            "  command: " + shlex.join(self.command),
        ]


@dataclass(frozen=True)
class TrainPlan:
    nodes: tuple[str, ...]
    gpus: tuple[str, ...]  # per node
    num_processes: int  # in total, across nodes
    num_machines: int
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    device: str  # "cpu" or "gpu"
    server: ServerPlan | None
    train: TrainPlan
    external_server: str | None = None  # vllm_server_base_url: a server we do not start
    # GPUs of the allocation that neither serve nor train, one line per node with what to do
    idle: tuple[str, ...] = ()
    # vllm_nodes > 1: the servers of the other serving nodes (`server` is the first node's)
    more_servers: tuple[ServerPlan, ...] = ()
    reward_model: RewardModelPlan | None = None  # reward_model_gpus > 0

    @property
    def servers(self) -> tuple[ServerPlan, ...]:
        """Every server the launcher starts, first node first; empty without a server."""
        return (self.server, *self.more_servers) if self.server is not None else ()

    def describe(self) -> str:
        lines = [f"device: {self.device}"]
        for s in self.servers:
            lines += _describe_server(s)
        if len(self.servers) > 1:
            lines.append(f"  router: {ROUTING}, over {len(self.servers)} servers")
        if self.server is None and self.external_server:
            lines.append(f"vllm server: external, {self.external_server} (not started here)")
        elif self.server is None:
            lines.append("vllm server: none")
        if self.reward_model is not None:
            lines += self.reward_model.describe()
        t = self.train
        gpus = ",".join(t.gpus) if t.gpus else "none (CPU)"
        lines += [
            f"training: {t.num_processes} processes on {t.num_machines} machine(s) "
            f"{','.join(t.nodes)}, GPUs per node {gpus}",
            "  env: " + _format_env(t.env),
            "  command: " + shlex.join(t.command),
        ]
        lines += [f"idle: {line}" for line in self.idle] or ["idle: none"]
        return "\n".join(lines)


def _describe_server(s: ServerPlan) -> list[str]:
    where = f"GPUs {','.join(s.gpus)}" if s.device == "gpu" else "CPU (vLLM's CPU build)"
    return [
        f"vllm server: node {s.node}, {where} (tensor parallel {s.tensor_parallel} x "
        f"data parallel {s.data_parallel}), port {s.port}, "
        f"weight sync {s.weight_sync}"
        + (f" (group port {s.group_port})" if s.weight_sync == "nccl" else ""),
        f"  replicas: {s.data_parallel} ({s.data_parallel_why})",
        f"  health: {s.health_url} (timeout {s.timeout:g}s: vllm_server_timeout)",
        "  env: " + _format_env(s.env),
        "  command: " + shlex.join(s.command),
    ]


def _format_env(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "(inherited)"


def parse_visible_devices(value: str | None) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES -> ids; unset or empty means no GPU. Ids may be UUIDs."""
    if not value:
        return ()
    ids = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        # CUDA stops at the first invalid id: "-1" hides every device, "0,-1,2" shows only 0.
        if part.lstrip("-").isdigit() and int(part) < 0:
            break
        # Slurm exports NoDevFiles when the job has no GPU of the requested kind.
        if part == "NoDevFiles":
            break
        ids.append(part)
    return tuple(ids)
