"""The launch plan: which GPUs serve vLLM, which train, which ports, which commands.

Pure: an Environment (what the job was given) and the recipe's keys (RecipeKeys, read
directly: one default per key, in recipe.keys) go in, a Plan comes out. Nothing here starts a
process, opens a port or reads os.environ; `environment_from_os` and the launcher do that at
the edges. training.sh, the submitit launcher, `maxent-grpo plan` and the tests all go
through `make_plan`. Key values (choices, ranges) were checked when the recipe was parsed;
what is checked here is the recipe against the allocation.

Modules: `model` (Environment, Ports, Plan and its parts), `server` (the vLLM server:
replicas, GPUs, command), `training` (processes and the accelerate command), `checks` (what
the allocation cannot run, and the GPUs a plan leaves idle).
"""

from __future__ import annotations

import dataclasses

from maxent_grpo.launch.plan.checks import check_vllm_nodes_used, idle_gpus
from maxent_grpo.launch.plan.model import (
    SERVERS_VARIABLE,
    Environment,
    Plan,
    PlanError,
    Ports,
    RewardModelPlan,
    ServerPlan,
    TrainPlan,
    parse_visible_devices,
)
from maxent_grpo.launch.plan.reward_model import split_reward_model, with_reward_model
from maxent_grpo.launch.plan.server import (
    cpu_server,
    default_data_parallel_size,
    gpu_server,
    node_servers,
)
from maxent_grpo.launch.plan.training import cpu_plan, gpu_plan, train_everywhere
from maxent_grpo.methods import RL_METHODS, uses_vllm_server
from maxent_grpo.recipe.parser import RecipeKeys

__all__ = [
    "Environment",
    "Plan",
    "PlanError",
    "Ports",
    "RewardModelPlan",
    "SERVERS_VARIABLE",
    "ServerPlan",
    "TrainPlan",
    "make_plan",
    "parse_visible_devices",
]


DEFAULT_PORTS = Ports()


def make_plan(env: Environment, recipe: RecipeKeys, ports: Ports = DEFAULT_PORTS) -> Plan:
    """Split the allocation between the vLLM server and training and build the commands.

    - No vLLM, colocate mode, or an external server (vllm_server_base_url): no server is
      planned; training gets every GPU of every node (or CPU processes when there is none).
    - Server on GPU (vllm_server_device: gpu, the default): the server gets the first
      tp x dp GPUs of the first node (vllm_tensor_parallel_size x vllm_data_parallel_size;
      unset, server.default_data_parallel_size decides). One node: training gets the rest of its
      GPUs. Several nodes: training gets every GPU of the other nodes.
    - Server on CPU (vllm_server_device: cpu, vLLM's CPU build): the server takes no GPU and
      training gets everything, as without a server. Weight sync must be `disk`.
    - reward_model_gpus: N > 0: a reward-model server takes the last N GPUs (one node; on
      CPU without GPUs) and the rules above split the others (plan/reward_model.py).
    """
    env, reward_model = split_reward_model(env, recipe, ports)
    if recipe.method not in RL_METHODS:  # SFT generates nothing: no server, every GPU trains
        plan = train_everywhere(env, recipe, ports, server=None)
        return dataclasses.replace(plan, idle=idle_gpus(env, plan, recipe, 1))
    plan = with_reward_model(_make_plan(env, recipe, ports), reward_model)
    default_dp, _why = default_data_parallel_size(recipe, len(env.gpus), len(env.nodes))
    return dataclasses.replace(plan, idle=idle_gpus(env, plan, recipe, default_dp))


def _make_plan(env: Environment, recipe: RecipeKeys, ports: Ports) -> Plan:
    server_mode = uses_vllm_server(recipe)
    check_vllm_nodes_used(recipe, server_mode)
    if recipe.vllm_nodes > 1:
        return _node_servers_plan(env, recipe, ports)
    if server_mode and recipe.vllm_server_base_url:
        plan = train_everywhere(env, recipe, ports, server=None)
        return Plan(plan.device, None, plan.train, external_server=recipe.vllm_server_base_url)
    if not server_mode:
        return train_everywhere(env, recipe, ports, server=None)
    if recipe.vllm_server_device == "cpu":
        server = cpu_server(env, recipe, ports)
        if env.gpus:
            return gpu_plan(env, recipe, ports, server, env.nodes, env.gpus)
        # Several nodes: the server has the first one to itself, as a GPU server would.
        train_nodes = env.nodes[1:] if len(env.nodes) > 1 else env.nodes
        return cpu_plan(env, recipe, ports, server, train_nodes)
    server, train_nodes, train_gpus = gpu_server(env, recipe, ports)
    return gpu_plan(env, recipe, ports, server, train_nodes, train_gpus)


def _node_servers_plan(env: Environment, recipe: RecipeKeys, ports: Ports) -> Plan:
    """vllm_nodes: N > 1: a server on each of the first N nodes, training on the others, which
    get every server's address (SERVERS_VARIABLE) besides the first one's flags."""
    first, *more = node_servers(env, recipe, ports)
    train_nodes = env.nodes[recipe.vllm_nodes :]
    if env.gpus:
        plan = gpu_plan(env, recipe, ports, first, train_nodes, env.gpus)
    else:
        plan = cpu_plan(env, recipe, ports, first, train_nodes)
    urls = ",".join(s.url for s in (first, *more))
    train = dataclasses.replace(plan.train, env={**plan.train.env, SERVERS_VARIABLE: urls})
    return dataclasses.replace(plan, train=train, more_servers=tuple(more))


def servers_summary(plan: Plan) -> str:
    """The servers of a checked plan (vLLM, reward model) for `check`'s verdict line, as the
    plan and the job's header see them."""
    s, rm = plan.server, plan.reward_model
    where = (f"{len(rm.gpus)} GPU(s)" if rm.gpus else "CPU") if rm else ""
    reward = f"; reward model server on {where} of {rm.node}" if rm else ""
    if s is None or s.device != "gpu":
        return reward
    nodes = ",".join(server.node for server in plan.servers)  # vllm_nodes: one per node
    return (
        f"; vLLM server{'s' if len(plan.servers) > 1 else ''} on {len(s.gpus)} GPU(s) of "
        f"{'each of ' if len(plan.servers) > 1 else ''}{nodes} "
        f"({s.data_parallel} replica(s) x tensor parallel {s.tensor_parallel})" + reward
    )
