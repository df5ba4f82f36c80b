"""The launch plan: which GPUs serve vLLM, which train, which ports, which commands.

Pure: an Environment (what the job was given) and the recipe's keys (RecipeKeys, read
directly: one default per key, in recipe.keys) go in, a Plan comes out. Nothing here starts a
process, opens a port or reads os.environ; `environment_from_os` and the launcher do that at
the edges. training.sh, the submitit launcher, `maxent-grpo plan` and the tests all go
through `make_plan`. Key values (choices, ranges) were checked when the recipe was parsed;
what is checked here is the recipe against the allocation.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field

from maxent_grpo.errors import UserError
from maxent_grpo.methods import METHODS
from maxent_grpo.recipe.parser import RecipeKeys

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
    cpus: int | None = None  # CPUs per node given to the job (None: unknown)


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
    env: dict[str, str]
    device: str  # "gpu" or "cpu" (vllm_server_device)
    weight_sync: str  # vllm_weight_sync
    timeout: float  # seconds to wait for /health (vllm_server_timeout)
    tensor_parallel: int = 1
    data_parallel: int = 1  # replicas (vLLM's --data-parallel-size)

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
    # GPUs of the allocation that neither serve nor train, one line per node with what to do
    idle: tuple[str, ...] = ()

    def describe(self) -> str:
        lines = [f"device: {self.device}"]
        if self.server:
            s = self.server
            where = f"GPUs {','.join(s.gpus)}" if s.device == "gpu" else "CPU (vLLM's CPU build)"
            lines += [
                f"vllm server: node {s.node}, {where} (tensor parallel {s.tensor_parallel} x "
                f"data parallel {s.data_parallel}), port {s.port}, "
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
        lines += [f"idle: {line}" for line in self.idle] or ["idle: none"]
        return "\n".join(lines)


def _format_env(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "(inherited)"


def make_plan(env: Environment, recipe: RecipeKeys, ports: Ports = Ports()) -> Plan:
    """Split the allocation between the vLLM server and training and build the commands.

    - No vLLM, colocate mode, or an external server (vllm_server_base_url): no server is
      planned; training gets every GPU of every node (or CPU processes when there is none).
    - Server on GPU (vllm_server_device: gpu, the default): the server gets the first
      tp x dp GPUs of the first node (vllm_tensor_parallel_size x vllm_data_parallel_size;
      dp unset: 1 on one node, the whole first node on several). One node: training gets the
      rest of its GPUs. Several nodes: training gets every GPU of the other nodes.
    - Server on CPU (vllm_server_device: cpu, vLLM's CPU build): the server takes no GPU and
      training gets everything, as without a server. Weight sync must be `disk`.
    """
    plan = _make_plan(env, recipe, ports)
    return dataclasses.replace(plan, idle=idle_gpus(env, plan, recipe))


def _make_plan(env: Environment, recipe: RecipeKeys, ports: Ports) -> Plan:
    server_mode = recipe.use_vllm and recipe.vllm_mode == "server"
    if server_mode and recipe.vllm_server_base_url:
        plan = _train_everywhere(env, recipe, ports, server=None)
        return Plan(plan.device, None, plan.train, external_server=recipe.vllm_server_base_url)
    if not server_mode:
        return _train_everywhere(env, recipe, ports, server=None)
    if recipe.vllm_server_device == "cpu":
        return _cpu_server_plan(env, recipe, ports)
    return _gpu_server_plan(env, recipe, ports)


def _train_everywhere(
    env: Environment, recipe: RecipeKeys, ports: Ports, server: ServerPlan | None
) -> Plan:
    if not env.gpus:
        return _cpu_plan(env, recipe, ports, server, env.nodes)
    return _gpu_plan(env, recipe, ports, server, env.nodes, env.gpus)


def _cpu_server_plan(env: Environment, recipe: RecipeKeys, ports: Ports) -> Plan:
    if recipe.vllm_weight_sync == "nccl":
        raise PlanError(
            "vllm_server_device: cpu with vllm_weight_sync: nccl: NCCL weight sync needs CUDA "
            "on the server and the trainer; set vllm_weight_sync: disk"
        )
    if recipe.vllm_tensor_parallel_size != 1:
        raise PlanError(
            f"vllm_tensor_parallel_size: {recipe.vllm_tensor_parallel_size} with "
            "vllm_server_device: cpu; a CPU server runs one worker, set it to 1"
        )
    server = _server_plan(
        env.nodes[0], (), recipe, ports, env.python, "cpu", recipe.vllm_data_parallel_size or 1
    )
    if env.gpus:
        return _gpu_plan(env, recipe, ports, server, env.nodes, env.gpus)
    # Several nodes: the server has the first one to itself, as a GPU server would.
    train_nodes = env.nodes[1:] if len(env.nodes) > 1 else env.nodes
    return _cpu_plan(env, recipe, ports, server, train_nodes)


def _gpu_server_plan(env: Environment, recipe: RecipeKeys, ports: Ports) -> Plan:
    tp = recipe.vllm_tensor_parallel_size
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
    dp = data_parallel_size(recipe, len(env.gpus), len(env.nodes))
    if tp * dp > len(env.gpus):
        raise PlanError(
            f"vllm_tensor_parallel_size: {tp} x vllm_data_parallel_size: {dp} = {tp * dp} server "
            f"GPUs but each node has {len(env.gpus)} ({','.join(env.gpus)}); the server runs on "
            f"one node: lower vllm_data_parallel_size to {len(env.gpus) // tp} or less"
        )
    server_gpus = env.gpus[: tp * dp]
    if len(env.nodes) > 1:
        # vLLM owns the first node; the other nodes train on all of their GPUs.
        train_nodes, train_gpus = env.nodes[1:], env.gpus
    else:
        train_nodes, train_gpus = env.nodes, env.gpus[tp * dp :]
        if not train_gpus:
            lower = "lower vllm_data_parallel_size, " if dp > 1 else ""
            raise PlanError(
                f"use_vllm with vllm_mode: server needs {tp * dp} GPU(s) for vLLM plus at least "
                f"one to train, but the job has {len(env.gpus)} ({','.join(env.gpus)}); request "
                f"{tp * dp + 1}+ GPUs, {lower}or set vllm_mode: colocate"
            )
    server = _server_plan(env.nodes[0], server_gpus, recipe, ports, env.python, "gpu", dp)
    return _gpu_plan(env, recipe, ports, server, train_nodes, train_gpus)


def data_parallel_size(recipe: RecipeKeys, gpus_per_node: int, nodes: int) -> int:
    """Server replicas: the recipe's vllm_data_parallel_size; unset, 1 on one node (the
    other GPUs train) and the whole first node on several (no trainer runs there anyway)."""
    if recipe.vllm_data_parallel_size is not None:
        return recipe.vllm_data_parallel_size
    if nodes > 1 and recipe.vllm_weight_sync != "lora":
        return max(gpus_per_node // recipe.vllm_tensor_parallel_size, 1)
    return 1


def _server_plan(
    node: str,
    gpus: tuple[str, ...],
    recipe: RecipeKeys,
    ports: Ports,
    python: str,
    device: str,
    dp: int,
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
        recipe.model_name_or_path or "",
        "--host",
        "0.0.0.0",
        "--port",
        str(ports.vllm),
        "--tensor-parallel-size",
        str(recipe.vllm_tensor_parallel_size),
        "--data-parallel-size",
        str(dp),
        "--gpu-memory-utilization",
        str(recipe.vllm_server_gpu_memory_utilization),
        "--dtype",
        recipe.vllm_server_dtype,
        # Importance-sampling correction needs logprobs after temperature/logit processing.
        "--logprobs-mode",
        "processed_logprobs",
        "--max-logprobs",
        "-1",
    ]
    if recipe.model_revision:
        command += ["--revision", recipe.model_revision]
    if recipe.vllm_max_model_length:
        command += ["--max-model-len", str(recipe.vllm_max_model_length)]
    if recipe.vllm_server_enforce_eager:
        command += ["--enforce-eager"]
    if recipe.trust_remote_code:
        command += ["--trust-remote-code"]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus), "VLLM_SERVER_DEV_MODE": "1"}
    if recipe.vllm_weight_sync == "nccl":
        command += ["--weight-transfer-config", '{"backend": "nccl"}']
    if recipe.vllm_weight_sync == "lora":
        _check_lora(recipe, dp)
        command += ["--enable-lora", "--max-lora-rank", str(lora_rank(recipe.lora_r))]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter
    return ServerPlan(
        node=node,
        gpus=gpus,
        port=ports.vllm,
        group_port=ports.vllm_group,
        command=tuple(command),
        env=env,
        device=device,
        weight_sync=recipe.vllm_weight_sync,
        timeout=recipe.vllm_server_timeout,
        tensor_parallel=recipe.vllm_tensor_parallel_size,
        data_parallel=dp,
    )


# vLLM's --max-lora-rank accepts these; a smaller adapter is served under the next one up.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of `rank`."""
    for allowed in LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise PlanError(f"lora_r: {rank}; vLLM serves LoRA adapters up to rank {LORA_RANKS[-1]}")


def _check_lora(recipe: RecipeKeys, dp: int) -> None:
    if not recipe.use_peft:
        raise PlanError(
            "vllm_weight_sync: lora sends the LoRA adapter only, and this recipe trains the "
            "whole model (use_peft: false); set use_peft: true, or vllm_weight_sync: disk/nccl"
        )
    if dp > 1:
        raise PlanError(
            f"vllm_weight_sync: lora with vllm_data_parallel_size: {dp}: vLLM loads a runtime "
            "adapter into the replica that answers the request only; set "
            "vllm_data_parallel_size: 1, or vllm_weight_sync: disk/nccl for several replicas"
        )


def _trainer_args(recipe: RecipeKeys, server: ServerPlan | None) -> tuple[str, ...]:
    args = (*METHODS[recipe.method].entry(), "--config", recipe.path)
    if server is not None:
        args += (
            "--vllm_server_host",
            server.node,
            "--vllm_server_port",
            str(server.port),
            "--vllm_group_port",
            str(server.group_port),
        )
    return args + recipe.overrides


def _cpu_plan(
    env: Environment,
    recipe: RecipeKeys,
    ports: Ports,
    server: ServerPlan | None,
    train_nodes: tuple[str, ...],
) -> Plan:
    """CPU training (gloo): num_processes, else cpu_processes on one node, one per node on
    several; spread evenly over the training nodes."""
    default = env.cpu_processes if len(train_nodes) == 1 else len(train_nodes)
    n = _processes(recipe, train_nodes, default, available=None)
    launch = [env.python, "-m", "accelerate.commands.launch"]
    if n > 1:
        # `--cpu --num_processes N` silently runs one process; --multi_gpu on CPU uses gloo.
        launch += ["--multi_gpu"]
    launch += [
        "--num_processes",
        str(n),
        "--num_machines",
        str(len(train_nodes)),
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(ports.main_process),
    ]
    if len(env.nodes) > 1:
        launch += ["--main_process_ip", train_nodes[0]]
    # A CPU vLLM server on the same node competes for the same cores.
    shares_node = server is not None and server.node in train_nodes
    threads = _threads(env, recipe, n // len(train_nodes) + shares_node)
    train = TrainPlan(
        nodes=train_nodes,
        gpus=(),
        num_processes=n,
        num_machines=len(train_nodes),
        command=_per_node(env, train_nodes, launch, _trainer_args(recipe, server)),
        env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": threads},
    )
    return Plan(device="cpu", server=server, train=train)


def _threads(env: Environment, recipe: RecipeKeys, processes_per_node: int) -> str:
    """OpenMP threads per training process: the node's CPUs shared out, at least 1.

    More threads than cores makes CPU work 3-10x slower; the recipe's env: block wins.
    """
    if "OMP_NUM_THREADS" in recipe.env:
        return recipe.env["OMP_NUM_THREADS"]
    return str(max(1, (env.cpus or 1) // max(processes_per_node, 1)))


# Each node's accelerate launcher is one task of an srun step; its machine rank is the task's
# rank in that step (SLURM_PROCID: 0..N-1 whatever --relative offset the step starts at).
MACHINE_RANK = '"$SLURM_PROCID"'


def _processes(
    recipe: RecipeKeys, train_nodes: tuple[str, ...], default: int, available: int | None
) -> int:
    """Training processes in all: num_processes when set (at most `available`), else default."""
    wanted = recipe.num_processes
    if wanted is None:
        return default
    if available is not None and wanted > available:
        raise PlanError(
            f"num_processes: {wanted} but only {available} GPU(s) are left for "
            f"training; request more GPUs or lower num_processes"
        )
    if len(train_nodes) > 1 and wanted % len(train_nodes):
        raise PlanError(
            f"num_processes: {wanted} does not divide evenly over the "
            f"{len(train_nodes)} training nodes; use a multiple of {len(train_nodes)}"
        )
    return wanted


def _per_node(
    env: Environment, train_nodes: tuple[str, ...], launch: list[str], trainer: tuple[str, ...]
) -> tuple[str, ...]:
    """The training command: accelerate here on one node; one per training node on several,
    started by one srun step (also for a single training node: it is not the node the
    launcher runs on). --relative skips the nodes before the first training node (vLLM's).
    """
    if len(env.nodes) == 1:
        return tuple(launch) + trainer
    n = len(train_nodes)
    offset = env.nodes.index(train_nodes[0]) if train_nodes[0] in env.nodes else 0
    per_node_command = (
        f"exec {shlex.join(launch)} --machine_rank {MACHINE_RANK} {shlex.join(trainer)}"
    )
    return (
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


def _gpu_plan(
    env: Environment,
    recipe: RecipeKeys,
    ports: Ports,
    server: ServerPlan | None,
    train_nodes: tuple[str, ...],
    train_gpus: tuple[str, ...],
) -> Plan:
    available = len(train_gpus) * len(train_nodes)
    total = _processes(recipe, train_nodes, available, available)
    launch = [env.python, "-m", "accelerate.commands.launch"]
    if recipe.accelerate_config:
        launch += ["--config_file", recipe.accelerate_config]
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
    train = TrainPlan(
        nodes=train_nodes,
        gpus=train_gpus,
        num_processes=total,
        num_machines=len(train_nodes),
        command=_per_node(env, train_nodes, launch, _trainer_args(recipe, server)),
        env={
            "CUDA_VISIBLE_DEVICES": ",".join(train_gpus),
            "OMP_NUM_THREADS": _threads(env, recipe, total // len(train_nodes)),
        },
    )
    return Plan(device="gpu", server=server, train=train)


def idle_gpus(env: Environment, plan: Plan, recipe: RecipeKeys) -> tuple[str, ...]:
    """Per node, the GPUs that neither serve nor train, and how to put them to work."""
    lines = []
    t, s = plan.train, plan.server
    # accelerate uses the first num_processes / num_machines visible GPUs of each node.
    per_node = t.num_processes // max(t.num_machines, 1)
    for node in env.nodes:
        used = set(t.gpus[:per_node]) if node in t.nodes else set()
        serves = s is not None and s.node == node and s.device == "gpu"
        used |= set(s.gpus) if serves else set()
        idle = [g for g in env.gpus if g not in used]
        if not idle:
            continue
        if serves and node not in t.nodes:
            tp = recipe.vllm_tensor_parallel_size
            whole = len(env.gpus) // tp
            if s.weight_sync == "lora":
                hint = "vllm_weight_sync: lora serves one replica; disk or nccl sync serve more"
            elif whole > s.data_parallel:
                hint = (
                    f"set vllm_data_parallel_size: {whole} (or unset it) to serve with the "
                    "whole node"
                )
            else:
                hint = f"use a vllm_tensor_parallel_size that divides {len(env.gpus)}"
        else:
            hint = "unset num_processes, or raise it, to train on them"
        lines.append(f"node {node} GPUs {','.join(idle)} ({hint})")
    return tuple(lines)


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
