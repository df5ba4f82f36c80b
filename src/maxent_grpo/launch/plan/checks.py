"""The recipe against the allocation: what cannot run (PlanError, one line with the fix), and
the GPUs a plan leaves idle (a line per node, with what would put them to work)."""

from __future__ import annotations

from maxent_grpo.launch.plan.model import Environment, Plan, PlanError
from maxent_grpo.recipe.parser import RecipeKeys


def check_cpu_server(recipe: RecipeKeys) -> None:
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


def check_server_nodes(env: Environment, recipe: RecipeKeys) -> None:
    """vllm_nodes: N > 1 serves on the first N nodes; at least one node is left to train."""
    n, nodes = recipe.vllm_nodes, len(env.nodes)
    if n >= nodes:
        raise PlanError(
            f"vllm_nodes: {n} but the job has {nodes} node(s): the first {n} run a vLLM "
            f"server each and at least one more must train; request {n + 1}+ nodes "
            f"(--nodes), or lower vllm_nodes to {max(nodes - 1, 1)}"
        )


def check_vllm_nodes_used(recipe: RecipeKeys, server_mode: bool) -> None:
    """vllm_nodes > 1 means servers this launcher starts; anything else would ignore it."""
    if recipe.vllm_nodes == 1:
        return
    if not server_mode:
        raise PlanError(
            f"vllm_nodes: {recipe.vllm_nodes} needs vllm servers (use_vllm: true, vllm_mode: "
            "server); set vllm_nodes: 1, or use_vllm: true and vllm_mode: server"
        )
    if recipe.vllm_server_base_url:
        raise PlanError(
            f"vllm_nodes: {recipe.vllm_nodes} with vllm_server_base_url: that server is not "
            "started here; unset one of them"
        )


def check_server_gpus(env: Environment, tp: int) -> None:
    """A GPU server needs a visible GPU, and its tensor-parallel group fits on one node."""
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


def check_replicas(env: Environment, tp: int, dp: int) -> None:
    """tp x dp server GPUs fit on the first node, and on one node leave one to train."""
    n = len(env.gpus)
    if tp * dp > n:
        raise PlanError(
            f"vllm_tensor_parallel_size: {tp} x vllm_data_parallel_size: {dp} = {tp * dp} server "
            f"GPUs but each node has {n} ({','.join(env.gpus)}); the server runs on "
            f"one node: lower vllm_data_parallel_size to {n // tp} or less"
        )
    if len(env.nodes) == 1 and tp * dp == n:
        lower = "lower vllm_data_parallel_size, " if dp > 1 else ""
        raise PlanError(
            f"use_vllm with vllm_mode: server needs {tp * dp} GPU(s) for vLLM plus at least "
            f"one to train, but the job has {n} ({','.join(env.gpus)}); request "
            f"{tp * dp + 1}+ GPUs, {lower}or set vllm_mode: colocate"
        )


def check_lora(recipe: RecipeKeys, dp: int) -> None:
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


def check_processes(wanted: int, train_nodes: tuple[str, ...], available: int | None) -> None:
    """num_processes: at most the GPUs left for training, evenly over the training nodes."""
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


def idle_gpus(env: Environment, plan: Plan, recipe: RecipeKeys, default_dp: int) -> tuple[str, ...]:
    """Per node, the GPUs that neither serve nor train, and how to put them to work.
    default_dp: the replicas vllm_data_parallel_size unset gives (server.py)."""
    lines = []
    t = plan.train
    # accelerate uses the first num_processes / num_machines visible GPUs of each node.
    per_node = t.num_processes // max(t.num_machines, 1)
    for node in env.nodes:
        used = set(t.gpus[:per_node]) if node in t.nodes else set()
        on_node = [s for s in plan.servers if s.node == node]
        s = on_node[0] if on_node else None
        serves = s is not None and s.device == "gpu"
        used |= set(s.gpus) if serves else set()
        idle = [g for g in env.gpus if g not in used]
        if not idle:
            continue
        if serves and node not in t.nodes:
            whole = len(env.gpus) // recipe.vllm_tensor_parallel_size
            if s.weight_sync == "lora":
                hint = "vllm_weight_sync: lora serves one replica; disk or nccl sync serve more"
            elif whole > s.data_parallel:
                unset = " (or unset it)" if default_dp == whole else ""
                hint = f"set vllm_data_parallel_size: {whole}{unset} to serve with the whole node"
            else:
                hint = f"use a vllm_tensor_parallel_size that divides {len(env.gpus)}"
        elif s is not None and node not in t.nodes:
            hint = "this node runs a CPU vLLM server; vllm_server_device: gpu serves with them"
        else:
            hint = "unset num_processes, or raise it, to train on them"
        lines.append(f"node {node} GPUs {','.join(idle)} ({hint})")
    return tuple(lines)
