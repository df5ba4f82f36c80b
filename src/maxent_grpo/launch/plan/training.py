"""The training part of a plan: how many processes where, and the `accelerate launch` command
(one per training node through srun on several nodes)."""

from __future__ import annotations

import shlex

from maxent_grpo.launch.plan.checks import check_processes
from maxent_grpo.launch.plan.model import Environment, Plan, Ports, ServerPlan, TrainPlan
from maxent_grpo.launch.plan.server import bind_address
from maxent_grpo.methods import METHODS
from maxent_grpo.recipe.parser import RecipeKeys

# Each node's accelerate launcher is one task of an srun step; its machine rank is the task's
# rank in that step (SLURM_PROCID: 0..N-1 whatever --relative offset the step starts at).
MACHINE_RANK = '"$SLURM_PROCID"'


def train_everywhere(
    env: Environment, recipe: RecipeKeys, ports: Ports, server: ServerPlan | None
) -> Plan:
    if not env.gpus:
        return cpu_plan(env, recipe, ports, server, env.nodes)
    return gpu_plan(env, recipe, ports, server, env.nodes, env.gpus)


def _trainer_args(recipe: RecipeKeys, server: ServerPlan | None) -> tuple[str, ...]:
    args = (*METHODS[recipe.method].entry(), "--config", recipe.path)
    if server is not None:
        args += (
            *("--vllm_server_host", server.host, "--vllm_server_port", str(server.port)),
            *("--vllm_group_port", str(server.group_port)),
        )
    return args + recipe.overrides


def cpu_plan(
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
        *("--num_processes", str(n), "--num_machines", str(len(train_nodes))),
        *("--mixed_precision", "no", "--dynamo_backend", "no"),
        *("--main_process_port", str(ports.main_process)),
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
        env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": threads, **_cpu_heap(recipe)},
    )
    return Plan(device="cpu", server=server, train=train)


# glibc's heap for CPU training: blocks under 32 MiB from the heap, kept up to 256 MiB free.
# Left to glibc's defaults, its threshold moves with each process's allocation history, and a
# step's tensors are mapped and unmapped anew: 4,100-5,900 page faults a step on the smoke
# recipe against 2,090 with these (peak RSS no higher), the cost bench/bench_overhead.py
# found outside every timer (docs/performance.md). On a GPU the
# tensors are CUDA's caching allocator's: not set there.
CPU_HEAP = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def _cpu_heap(recipe: RecipeKeys) -> dict[str, str]:
    """CPU_HEAP, unless the recipe's env: block tunes glibc's heap itself."""
    if any(name in recipe.env for name in CPU_HEAP):
        return {}
    return dict(CPU_HEAP)


def gpu_plan(
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
        *("--num_processes", str(total), "--num_machines", str(len(train_nodes))),
        *("--main_process_ip", train_nodes[0], "--main_process_port", str(ports.main_process)),
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
            **_group_address(env, server, train_nodes),
        },
    )
    return Plan(device="gpu", server=server, train=train)


def _group_address(
    env: Environment, server: ServerPlan | None, train_nodes: tuple[str, ...]
) -> dict[str, str]:
    """NCCL weight sync: the address the trainer's rendezvous for the weight group binds
    (vLLM's get_ip reads VLLM_HOST_IP; the trainer's main process, on the first training node,
    listens there for the servers' workers), as the servers bind: loopback on one node."""
    if server is None or server.weight_sync != "nccl":
        return {}
    return {"VLLM_HOST_IP": bind_address(env, train_nodes[0])}


def _threads(env: Environment, recipe: RecipeKeys, processes_per_node: int) -> str:
    """OpenMP threads per training process: the node's CPUs shared out, at least 1.

    More threads than cores makes CPU work 3-10x slower; the recipe's env: block wins.
    """
    if "OMP_NUM_THREADS" in recipe.env:
        return recipe.env["OMP_NUM_THREADS"]
    return str(max(1, (env.cpus or 1) // max(processes_per_node, 1)))


def _processes(
    recipe: RecipeKeys, train_nodes: tuple[str, ...], default: int, available: int | None
) -> int:
    """Training processes in all: num_processes when set (at most `available`), else default."""
    if recipe.num_processes is None:
        return default
    check_processes(recipe.num_processes, train_nodes, available)
    return recipe.num_processes


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
