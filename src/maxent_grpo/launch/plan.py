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

# `python -m` target of the server command (vLLM's own CLI, in this venv's interpreter).
VLLM_MODULE = "vllm.entrypoints.cli.main"


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
    model_revision: str | None = None
    trust_remote_code: bool = False
    max_model_len: int | None = None
    vllm_gpu_memory_utilization: float = 0.9
    extra_args: tuple[str, ...] = ()
    # Server-mode settings (recipe keys of the same names; see configs.py).
    vllm_server_device: str = "gpu"  # "gpu" or "cpu" (vLLM's CPU build)
    vllm_weight_sync: str = "nccl"  # "nccl" (TRL's own) or "disk" (safetensors + reload_weights)
    vllm_server_dtype: str = "auto"
    vllm_server_enforce_eager: bool = False
    vllm_server_timeout: float = 1200.0
    vllm_server_base_url: str | None = None  # an external server: none is started


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
    device: str = "gpu"  # "gpu" or "cpu"
    weight_sync: str = "nccl"
    timeout: float = 1200.0  # seconds to wait for /health (vllm_server_timeout)

    @property
    def url(self) -> str:
        return f"http://{self.node}:{self.port}"

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"


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

    def describe(self) -> str:
        lines = [f"device: {self.device}"]
        if self.server:
            s = self.server
            where = f"GPUs {','.join(s.gpus)}" if s.device == "gpu" else "CPU (vLLM's CPU build)"
            lines += [
                f"vllm server: node {s.node}, {where}, port {s.port}, "
                f"weight sync {s.weight_sync}"
                + (f" (group port {s.group_port})" if s.weight_sync == "nccl" else ""),
                f"  health: {s.health_url} (timeout {s.timeout:g}s: vllm_server_timeout)",
                "  env: " + _format_env(s.env),
                "  command: " + shlex.join(s.command),
            ]
        elif self.external_server:
            lines.append(f"vllm server: external, {self.external_server} (not started here)")
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


VLLM_MODES = ("colocate", "server")
SERVER_DEVICES = ("gpu", "cpu")
WEIGHT_SYNCS = ("nccl", "disk")


def make_plan(env: Environment, req: LaunchRequest, ports: Ports = Ports()) -> Plan:
    """Split the allocation between the vLLM server and training and build the commands.

    - No vLLM, colocate mode, or an external server (vllm_server_base_url): no server is
      planned; training gets every GPU of every node (or CPU processes when there is none).
    - Server on GPU (vllm_server_device: gpu, the default): the server gets the first
      vllm_tensor_parallel_size GPUs of the first node. One node: training gets the rest of
      its GPUs. Several nodes: training gets every GPU of the other nodes.
    - Server on CPU (vllm_server_device: cpu, vLLM's CPU build): the server takes no GPU and
      training gets everything, as without a server. Weight sync must be `disk`.
    """
    _check_request(req)
    server_mode = req.use_vllm and req.vllm_mode == "server"
    if server_mode and req.vllm_server_base_url:
        plan = _train_everywhere(env, req, ports, server=None)
        return Plan(plan.device, None, plan.train, external_server=req.vllm_server_base_url)
    if not server_mode:
        return _train_everywhere(env, req, ports, server=None)
    if req.vllm_server_device == "cpu":
        return _cpu_server_plan(env, req, ports)
    return _gpu_server_plan(env, req, ports)


def _check_request(req: LaunchRequest) -> None:
    if req.use_vllm and req.vllm_mode not in VLLM_MODES:
        raise PlanError(f"vllm_mode: {req.vllm_mode!r}; must be one of {', '.join(VLLM_MODES)}")
    if req.vllm_server_device not in SERVER_DEVICES:
        raise PlanError(
            f"vllm_server_device: {req.vllm_server_device!r}; must be one of "
            f"{', '.join(SERVER_DEVICES)}"
        )
    if req.vllm_weight_sync not in WEIGHT_SYNCS:
        raise PlanError(
            f"vllm_weight_sync: {req.vllm_weight_sync!r}; must be one of {', '.join(WEIGHT_SYNCS)}"
        )
    if req.vllm_tensor_parallel_size < 1:
        raise PlanError(
            f"vllm_tensor_parallel_size: {req.vllm_tensor_parallel_size}; must be 1 or more"
        )
    if req.vllm_server_timeout <= 0:
        raise PlanError(
            f"vllm_server_timeout: {req.vllm_server_timeout:g}; must be a positive number of "
            "seconds"
        )


def _train_everywhere(
    env: Environment, req: LaunchRequest, ports: Ports, server: ServerPlan | None
) -> Plan:
    if not env.gpus:
        return _cpu_plan(env, req, ports, server)
    return _gpu_plan(env, req, ports, server, env.nodes, env.gpus)


def _cpu_server_plan(env: Environment, req: LaunchRequest, ports: Ports) -> Plan:
    if req.vllm_weight_sync != "disk":
        raise PlanError(
            "vllm_server_device: cpu with vllm_weight_sync: nccl: NCCL weight sync needs CUDA "
            "on the server and the trainer; set vllm_weight_sync: disk"
        )
    if req.vllm_tensor_parallel_size != 1:
        raise PlanError(
            f"vllm_tensor_parallel_size: {req.vllm_tensor_parallel_size} with "
            "vllm_server_device: cpu; a CPU server runs one worker, set it to 1"
        )
    server = _server_plan(env.nodes[0], (), req, ports, env.python, device="cpu")
    return _train_everywhere(env, req, ports, server)


def _gpu_server_plan(env: Environment, req: LaunchRequest, ports: Ports) -> Plan:
    tp = req.vllm_tensor_parallel_size
    if not env.gpus:
        raise PlanError(
            "vllm_mode: server needs a GPU for the vLLM server and none is visible "
            "(CUDA_VISIBLE_DEVICES is empty or unset); run on a GPU node, or set "
            "vllm_server_device: cpu and vllm_weight_sync: disk (vLLM's CPU build), or set "
            "vllm_mode: colocate / use_vllm: false"
        )
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
    server = _server_plan(env.nodes[0], server_gpus, req, ports, env.python, device="gpu")
    return _gpu_plan(env, req, ports, server, train_nodes, train_gpus)


def _server_plan(
    node: str,
    gpus: tuple[str, ...],
    req: LaunchRequest,
    ports: Ports,
    python: str,
    device: str,
) -> ServerPlan:
    """`vllm serve` with the settings TRL's trainers expect (as `trl vllm-serve` builds them).

    Dev mode (VLLM_SERVER_DEV_MODE=1) exposes /server_info, /reset_prefix_cache and
    /collective_rpc, which weight sync uses. NCCL sync also needs the weight-transfer engine;
    disk sync reloads safetensors through /collective_rpc reload_weights instead.
    """
    command = [
        python,
        "-m",
        VLLM_MODULE,
        "serve",
        req.model,
        "--host",
        "0.0.0.0",
        "--port",
        str(ports.vllm),
        "--tensor-parallel-size",
        str(max(len(gpus), 1)),
        "--gpu-memory-utilization",
        str(req.vllm_gpu_memory_utilization),
        "--dtype",
        req.vllm_server_dtype,
        # Importance-sampling correction needs logprobs after temperature/logit processing.
        "--logprobs-mode",
        "processed_logprobs",
        "--max-logprobs",
        "-1",
    ]
    if req.model_revision:
        command += ["--revision", req.model_revision]
    if req.max_model_len:
        command += ["--max-model-len", str(req.max_model_len)]
    if req.vllm_server_enforce_eager:
        command += ["--enforce-eager"]
    if req.trust_remote_code:
        command += ["--trust-remote-code"]
    if req.vllm_weight_sync == "nccl":
        command += ["--weight-transfer-config", '{"backend": "nccl"}']
    return ServerPlan(
        node=node,
        gpus=gpus,
        port=ports.vllm,
        group_port=ports.vllm_group,
        command=tuple(command),
        env={"CUDA_VISIBLE_DEVICES": ",".join(gpus), "VLLM_SERVER_DEV_MODE": "1"},
        device=device,
        weight_sync=req.vllm_weight_sync,
        timeout=req.vllm_server_timeout,
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


def _cpu_plan(
    env: Environment, req: LaunchRequest, ports: Ports, server: ServerPlan | None
) -> Plan:
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
        command=tuple(launch) + _trainer_args(req, server),
        env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
    )
    return Plan(device="cpu", server=server, train=train)


# Each node's accelerate launcher is one task of an srun step; its machine rank is the task's
# rank in that step (SLURM_PROCID: 0..N-1 whatever --relative offset the step starts at).
MACHINE_RANK = '"$SLURM_PROCID"'


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
        if len(train_nodes) > 1 and req.num_processes % len(train_nodes):
            raise PlanError(
                f"num_processes: {req.num_processes} does not divide evenly over the "
                f"{len(train_nodes)} training nodes; use a multiple of {len(train_nodes)}"
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
    trainer = _trainer_args(req, server)
    if len(env.nodes) == 1:
        command = tuple(launch) + trainer
    else:
        # One accelerate launcher per training node, started by one srun step (also for a
        # single training node: it is not the node the launcher runs on); --relative skips
        # the nodes before the first training node (the vLLM node).
        n = len(train_nodes)
        offset = env.nodes.index(train_nodes[0]) if train_nodes[0] in env.nodes else 0
        per_node_command = (
            f"exec {shlex.join(launch)} --machine_rank {MACHINE_RANK} {shlex.join(trainer)}"
        )
        command = (
            "srun",
            f"--nodes={n}",
            f"--ntasks={n}",
            "--ntasks-per-node=1",
            *((f"--relative={offset}",) if offset else ()),
            "--kill-on-bad-exit=1",
            "bash",
            "-c",
            per_node_command,
        )
    train = TrainPlan(
        nodes=train_nodes,
        gpus=train_gpus,
        num_processes=total,
        num_machines=len(train_nodes),
        command=command,
        env={"CUDA_VISIBLE_DEVICES": ",".join(train_gpus)},
    )
    return Plan(device="gpu", server=server, train=train)


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
