"""The vLLM server's part of a plan: its replicas, its GPUs (or CPU), its command."""

from __future__ import annotations

import dataclasses

from maxent_grpo.launch.plan.checks import (
    check_cpu_server,
    check_lora,
    check_replicas,
    check_server_gpus,
    check_server_nodes,
)
from maxent_grpo.launch.plan.model import Environment, PlanError, Ports, ServerPlan
from maxent_grpo.recipe.parser import RecipeKeys
from maxent_grpo.server_auth import MIDDLEWARE
from maxent_grpo.vllm_health import group_port_of

# `python -m` target of the server command (vLLM's own CLI, in this venv's interpreter).
VLLM_MODULE = "vllm.entrypoints.cli.main"
# vLLM's --max-lora-rank accepts these; a smaller adapter is served under the next one up.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LOOPBACK = "127.0.0.1"


def bind_address(env: Environment, node: str) -> str:
    """The address a server of the run binds, and its clients use (the one decision of it):
    loopback when the whole job is one node (its trainers share the server's node), else the
    node's own name, which resolves to its address on the cluster network. Never 0.0.0.0."""
    return LOOPBACK if len(env.nodes) == 1 else node


def data_parallel_size(recipe: RecipeKeys, server_gpus: int, nodes: int) -> tuple[int, str]:
    """Server replicas (vLLM's --data-parallel-size) and why: the recipe's
    vllm_data_parallel_size, else the default below."""
    if recipe.vllm_data_parallel_size is not None:
        return recipe.vllm_data_parallel_size, "vllm_data_parallel_size"
    return default_data_parallel_size(recipe, server_gpus, nodes)


def default_data_parallel_size(recipe: RecipeKeys, server_gpus: int, nodes: int) -> tuple[int, str]:
    """Replicas when vllm_data_parallel_size is unset, and why (the one decision of it): one,
    except a GPU server on several nodes (the first node serves alone, no trainer runs there)
    without LoRA sync (an adapter reaches one replica only), which gets its whole node.
    server_gpus: the GPUs of the server's node (0 for a CPU server)."""
    unset = "vllm_data_parallel_size unset"
    tp = recipe.vllm_tensor_parallel_size
    if nodes == 1:
        return 1, f"{unset}: one replica on one node, whose other GPUs train"
    if recipe.vllm_weight_sync == "lora":
        return 1, f"{unset}: one replica, the one a LoRA adapter reaches"
    if not server_gpus:
        return 1, f"{unset}: one replica on a CPU server"
    whole = max(server_gpus // tp, 1)
    return whole, f"{unset}: the whole first node ({server_gpus} GPUs / tensor parallel {tp})"


def cpu_server(env: Environment, recipe: RecipeKeys, ports: Ports) -> ServerPlan:
    """vLLM's CPU build on the first node: no GPU, disk or LoRA weight sync."""
    check_cpu_server(recipe)
    replicas = data_parallel_size(recipe, 0, len(env.nodes))
    return server_plan(env.nodes[0], (), recipe, ports, env, "cpu", replicas)


def gpu_server(
    env: Environment, recipe: RecipeKeys, ports: Ports
) -> tuple[ServerPlan, tuple[str, ...], tuple[str, ...]]:
    """The first tp x dp GPUs of the first node serve; returns (server, training nodes, their
    GPUs): on one node its other GPUs, on several every GPU of the other nodes."""
    tp = recipe.vllm_tensor_parallel_size
    check_server_gpus(env, tp)
    dp, why = data_parallel_size(recipe, len(env.gpus), len(env.nodes))
    check_replicas(env, tp, dp)
    gpus = env.gpus[: tp * dp]
    server = server_plan(env.nodes[0], gpus, recipe, ports, env, "gpu", (dp, why))
    if len(env.nodes) > 1:  # vLLM owns the first node; the others train on all their GPUs
        return server, env.nodes[1:], env.gpus
    return server, env.nodes, env.gpus[tp * dp :]


def node_servers(env: Environment, recipe: RecipeKeys, ports: Ports) -> tuple[ServerPlan, ...]:
    """vllm_nodes > 1: one server on each of the first vllm_nodes nodes, the whole node each
    (tp x dp of its GPUs; vLLM's CPU build: no GPU), each with its own NCCL group port."""
    check_server_nodes(env, recipe)
    servers = []
    for index, node in enumerate(env.nodes[: recipe.vllm_nodes]):
        own = dataclasses.replace(ports, vllm_group=group_port_of(ports.vllm_group, index))
        if recipe.vllm_server_device == "cpu":
            check_cpu_server(recipe)
            replicas, gpus, device = data_parallel_size(recipe, 0, len(env.nodes)), (), "cpu"
        else:
            check_server_gpus(env, recipe.vllm_tensor_parallel_size)
            dp, why = data_parallel_size(recipe, len(env.gpus), len(env.nodes))
            replicas = dp, why.replace("the whole first node", "the whole node")
            check_replicas(env, recipe.vllm_tensor_parallel_size, replicas[0])
            gpus = env.gpus[: recipe.vllm_tensor_parallel_size * replicas[0]]
            device = "gpu"
        plan = server_plan(node, gpus, recipe, own, env, device, replicas)
        servers.append(dataclasses.replace(plan, command=on_node(index, plan.command)))
    return tuple(servers)


def on_node(index: int, command: tuple[str, ...]) -> tuple[str, ...]:
    """The command on the index-th node of the job: the launcher's own node (the first) runs
    it directly, another through a one-task srun step there (as training reaches its nodes)."""
    if index == 0:
        return command
    step = ("srun", "--nodes=1", "--ntasks=1", f"--relative={index}", "--kill-on-bad-exit=1")
    return (*step, *command)


def server_plan(
    node: str,
    gpus: tuple[str, ...],
    recipe: RecipeKeys,
    ports: Ports,
    env: Environment,
    device: str,
    replicas: tuple[int, str],
) -> ServerPlan:
    """`vllm serve` with the settings TRL's trainers expect (as `trl vllm-serve` builds them).

    Dev mode (VLLM_SERVER_DEV_MODE=1) exposes /server_info, /reset_prefix_cache and
    /collective_rpc, which weight sync uses. NCCL sync also needs the weight-transfer engine;
    disk sync reloads safetensors through /collective_rpc reload_weights instead. Every route
    but /health asks for the run's token (server_auth.TokenMiddleware, vLLM's --middleware;
    the token itself reaches the server in its environment, never on this command line).
    replicas: (vLLM's --data-parallel-size, why: data_parallel_size).
    """
    dp, why = replicas
    host = bind_address(env, node)
    command = [env.python, "-m", VLLM_MODULE, *_serve_args(recipe, ports, dp, host)]
    variables = {"CUDA_VISIBLE_DEVICES": ",".join(gpus), "VLLM_SERVER_DEV_MODE": "1"}
    if recipe.vllm_weight_sync == "nccl":
        command += ["--weight-transfer-config", '{"backend": "nccl"}']
    if device == "cpu" and dp == 1:
        # vLLM's CPU build otherwise runs the model in a worker process, and its engine waits
        # for the worker spinning (sched_yield for 1 s after each read): 0.23 CPU-s per 0.12 s
        # request measured, against 0.145 CPU-s in one process (docs/vllm.md). Its CPU
        # platform keeps the `uni` executor only without V1 multiprocessing.
        command += ["--distributed-executor-backend", "uni"]
        variables["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if recipe.vllm_weight_sync == "lora":
        check_lora(recipe, dp)
        command += ["--enable-lora", "--max-lora-rank", str(lora_rank(recipe.lora_r))]
        variables["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter
    return ServerPlan(
        node=node,
        host=host,
        gpus=gpus,
        port=ports.vllm,
        group_port=ports.vllm_group,
        command=tuple(command),
        env=variables,
        device=device,
        weight_sync=recipe.vllm_weight_sync,
        timeout=recipe.vllm_server_timeout,
        tensor_parallel=recipe.vllm_tensor_parallel_size,
        data_parallel=dp,
        data_parallel_why=why,
    )


def _serve_args(recipe: RecipeKeys, ports: Ports, dp: int, host: str) -> list[str]:
    """`serve MODEL` and the flags the recipe's keys set."""
    args = [
        *("serve", recipe.model_name_or_path or ""),
        *("--host", host, "--port", str(ports.vllm)),
        *("--middleware", MIDDLEWARE),
        *("--tensor-parallel-size", str(recipe.vllm_tensor_parallel_size)),
        *("--data-parallel-size", str(dp)),
        *("--gpu-memory-utilization", str(recipe.vllm_server_gpu_memory_utilization)),
        *("--dtype", recipe.vllm_server_dtype),
        # Importance-sampling correction needs logprobs after temperature/logit processing.
        *("--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1"),
    ]
    if recipe.model_revision:
        args += ["--revision", recipe.model_revision]
    if recipe.vllm_max_model_length:
        args += ["--max-model-len", str(recipe.vllm_max_model_length)]
    if recipe.vllm_server_enforce_eager:
        args += ["--enforce-eager"]
    if recipe.trust_remote_code:
        args += ["--trust-remote-code"]
    return args


def lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of `rank`."""
    for allowed in LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise PlanError(f"lora_r: {rank}; vLLM serves LoRA adapters up to rank {LORA_RANKS[-1]}")
