"""The launch plan: which GPUs serve vLLM, which train, which ports, which commands.

Pure: an Environment (what the job was given) and a LaunchRequest (what the recipe asks for)
go in, a Plan comes out. Nothing here starts a process, opens a port or reads os.environ;
`environment_from_os` and the runner do that at the edges. training.sh, the submitit
launcher, `maxent-grpo plan` and the tests all go through `make_plan`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from maxent_grpo.errors import UserError


class PlanError(UserError):
    """The allocation cannot run the recipe (e.g. too few GPUs)."""


@dataclass(frozen=True)
class Environment:
    """What the job was given. gpus are the ids visible on each node (CUDA_VISIBLE_DEVICES)."""

    gpus: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ("localhost",)
    cpu_processes: int = 2  # training processes when there is no GPU
    python: str = "python"


@dataclass(frozen=True)
class LaunchRequest:
    """What the recipe asks of the launcher."""

    recipe: str
    entry_script: str
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    vllm_tensor_parallel_size: int = 1
    num_processes: int | None = None
    accelerate_config: str | None = None
    model: str = ""
    max_model_len: int | None = None
    vllm_gpu_memory_utilization: float = 0.9
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Ports:
    """Ports picked at the edge by asking the OS: fixed numbers clash on shared nodes."""

    vllm: int = 8000
    vllm_group: int = 51216
    main_process: int = 29500


@dataclass(frozen=True)
class ServerPlan:
    node: str
    gpus: tuple[str, ...]
    port: int
    group_port: int
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def health_url(self) -> str:
        return f"http://{self.node}:{self.port}/health"


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

    def describe(self) -> str:
        lines = [f"device: {self.device}"]
        if self.server:
            lines += [
                f"vllm server: node {self.server.node}, GPUs {','.join(self.server.gpus)}, "
                f"port {self.server.port}, weight-sync group port {self.server.group_port}",
                f"  health: {self.server.health_url}",
                "  env: " + _format_env(self.server.env),
                "  command: " + shlex.join(self.server.command),
            ]
        else:
            lines.append("vllm server: none")
        t = self.train
        gpus = ",".join(t.gpus) if t.gpus else "none (CPU)"
        lines += [
            f"training: {t.num_processes} processes on {t.num_machines} machine(s) "
            f"{','.join(t.nodes)}, GPUs per node {gpus}",
            "  env: " + _format_env(t.env),
            "  command: " + shlex.join(t.command),
        ]
        return "\n".join(lines)


def _format_env(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "(inherited)"


def make_plan(env: Environment, req: LaunchRequest, ports: Ports = Ports()) -> Plan:
    """Split the allocation between the vLLM server and training and build the commands."""
    needs_server = req.use_vllm and req.vllm_mode == "server"
    if not env.gpus:
        return _cpu_plan(env, req, ports, needs_server)
    if not needs_server:
        return _gpu_plan(env, req, ports, server=None, train_nodes=env.nodes, train_gpus=env.gpus)

    tp = req.vllm_tensor_parallel_size
    if tp < 1:
        raise PlanError(f"vllm_tensor_parallel_size: {tp}; must be 1 or more")
    if tp > len(env.gpus):
        raise PlanError(
            f"vllm_tensor_parallel_size: {tp} but each node has {len(env.gpus)} GPU(s) "
            f"({','.join(env.gpus)}); request more GPUs or lower the tensor-parallel size"
        )
    server_gpus = env.gpus[:tp]
    if len(env.nodes) > 1:
        # vLLM owns the first node; the other nodes train on all of their GPUs.
        train_nodes, train_gpus = env.nodes[1:], env.gpus
    else:
        train_nodes, train_gpus = env.nodes, env.gpus[tp:]
        if not train_gpus:
            raise PlanError(
                f"use_vllm with vllm_mode: server needs {tp} GPU(s) for vLLM plus at least one to "
                f"train, but the job has {len(env.gpus)} ({','.join(env.gpus)}); request "
                f"{tp + 1}+ GPUs, or set vllm_mode: colocate"
            )
    server = _server_plan(env.nodes[0], server_gpus, req, ports)
    return _gpu_plan(env, req, ports, server, train_nodes, train_gpus)


def _server_plan(node: str, gpus: tuple[str, ...], req: LaunchRequest, ports: Ports) -> ServerPlan:
    command = (
        "trl",
        "vllm-serve",
        "--model",
        req.model,
        "--tensor_parallel_size",
        str(len(gpus)),
        "--host",
        "0.0.0.0",
        "--port",
        str(ports.vllm),
        "--gpu_memory_utilization",
        str(req.vllm_gpu_memory_utilization),
    )
    if req.max_model_len:
        command += ("--max_model_len", str(req.max_model_len))
    return ServerPlan(
        node=node,
        gpus=gpus,
        port=ports.vllm,
        group_port=ports.vllm_group,
        command=command,
        env={"CUDA_VISIBLE_DEVICES": ",".join(gpus)},
    )


def _trainer_args(req: LaunchRequest, server: ServerPlan | None) -> tuple[str, ...]:
    args = (req.entry_script, "--config", req.recipe)
    if server is not None:
        args += (
            "--vllm_server_host",
            server.node,
            "--vllm_server_port",
            str(server.port),
            "--vllm_group_port",
            str(server.group_port),
        )
    return args + req.extra_args


def _cpu_plan(env: Environment, req: LaunchRequest, ports: Ports, needs_server: bool) -> Plan:
    if needs_server:
        raise PlanError(
            "vllm_mode: server needs GPUs and none are visible (CUDA_VISIBLE_DEVICES is empty); "
            "run on a GPU node, or set use_vllm: false for a CPU run"
        )
    n = req.num_processes or env.cpu_processes
    launch = [env.python, "-m", "accelerate.commands.launch"]
    if n > 1:
        # `--cpu --num_processes N` silently runs one process; --multi_gpu on CPU uses gloo.
        launch += ["--multi_gpu"]
    launch += [
        "--num_processes",
        str(n),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(ports.main_process),
    ]
    train = TrainPlan(
        nodes=env.nodes[:1],
        gpus=(),
        num_processes=n,
        num_machines=1,
        command=tuple(launch) + _trainer_args(req, None),
        env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
    )
    return Plan(device="cpu", server=None, train=train)


def _gpu_plan(
    env: Environment,
    req: LaunchRequest,
    ports: Ports,
    server: ServerPlan | None,
    train_nodes: tuple[str, ...],
    train_gpus: tuple[str, ...],
) -> Plan:
    per_node = len(train_gpus)
    total = per_node * len(train_nodes)
    if req.num_processes is not None:
        if req.num_processes > total:
            raise PlanError(
                f"num_processes: {req.num_processes} but only {total} GPU(s) are left for "
                f"training; request more GPUs or lower num_processes"
            )
        total = req.num_processes
    launch = [env.python, "-m", "accelerate.commands.launch"]
    if req.accelerate_config:
        launch += ["--config_file", req.accelerate_config]
    elif total > 1:
        launch += ["--multi_gpu"]
    launch += [
        "--num_processes",
        str(total),
        "--num_machines",
        str(len(train_nodes)),
        "--main_process_ip",
        train_nodes[0],
        "--main_process_port",
        str(ports.main_process),
    ]
    if len(train_nodes) > 1:
        # One launcher per node (srun starts them); each derives its rank from SLURM_NODEID.
        launch += ["--machine_rank", "${MACHINE_RANK}"]
    train = TrainPlan(
        nodes=train_nodes,
        gpus=train_gpus,
        num_processes=total,
        num_machines=len(train_nodes),
        command=tuple(launch) + _trainer_args(req, server),
        env={"CUDA_VISIBLE_DEVICES": ",".join(train_gpus)},
    )
    return Plan(device="gpu", server=server, train=train)


def parse_visible_devices(value: str | None) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES -> ids; unset or empty means no GPU. Ids may be UUIDs."""
    if not value:
        return ()
    ids = tuple(part.strip() for part in value.split(",") if part.strip())
    # "-1" (or any negative index) hides every device from CUDA.
    if ids and ids[0].lstrip("-").isdigit() and int(ids[0]) < 0:
        return ()
    return ids
