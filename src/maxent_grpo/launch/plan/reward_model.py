"""The reward-model server's part of a plan (reward_model_gpus > 0): its GPUs, port, command.

It takes the last reward_model_gpus GPUs of the job's node; the vLLM server and training are
planned on the others. On a machine without GPUs it runs on CPU beside the trainers. The
trainers get its URL in REWARD_MODEL_VARIABLE and score the recipe's `model:` entry there
(rewards/remote.py).
"""

from __future__ import annotations

import dataclasses

from maxent_grpo.launch.plan.model import Environment, Plan, PlanError, Ports, RewardModelPlan
from maxent_grpo.launch.plan.server import bind_address, data_parallel_size
from maxent_grpo.methods import RL_METHODS, uses_vllm_server
from maxent_grpo.recipe.parser import RecipeKeys
from maxent_grpo.rewards.remote import MODEL_PREFIX, REWARD_MODEL_VARIABLE

SERVER_MODULE = "maxent_grpo.rewards.model_server"


def _served_model(recipe: RecipeKeys) -> str:
    """The one `model:` entry of reward_funcs, which the server scores."""
    n = recipe.reward_model_gpus
    entries = [
        name.strip()[len(MODEL_PREFIX) :].strip()
        for name in recipe.values.get("reward_funcs") or []
        if isinstance(name, str) and name.strip().startswith(MODEL_PREFIX)
    ]
    if recipe.method not in RL_METHODS:
        raise PlanError(
            f"reward_model_gpus: {n} with method {recipe.method}, which scores nothing; "
            "set reward_model_gpus: 0"
        )
    if len(entries) != 1:
        found = f"{len(entries)} model: entries" if entries else "no model: entry"
        raise PlanError(
            f"reward_model_gpus: {n} serves one reward model, and reward_funcs has {found}; "
            "give exactly one model:<hub id or path>, or set reward_model_gpus: 0"
        )
    return entries[0]


def _server_gpus(env: Environment, recipe: RecipeKeys) -> int:
    """GPUs the vLLM server takes on the one node (its replicas: plan/server.py's rule)."""
    if not uses_vllm_server(recipe) or recipe.vllm_server_base_url:
        return 0
    if recipe.vllm_server_device == "cpu":
        return 0
    replicas, _why = data_parallel_size(recipe, len(env.gpus), len(env.nodes))
    return recipe.vllm_tensor_parallel_size * replicas


def _check_fits(env: Environment, recipe: RecipeKeys) -> None:
    n, have = recipe.reward_model_gpus, len(env.gpus)
    if len(env.nodes) > 1:
        raise PlanError(
            f"reward_model_gpus: {n} on {len(env.nodes)} nodes: the reward-model server is "
            "planned on one node only; run on one node, or set reward_model_gpus: 0 (TRL "
            "scores the model in the trainers)"
        )
    serve = _server_gpus(env, recipe)
    if n + serve + 1 > have:
        vllm = f" + vLLM server {serve}" if serve else ""
        raise PlanError(
            f"reward_model_gpus: {n}{vllm} + training at least 1 = {n + serve + 1} GPUs, but "
            f"the job has {have} ({','.join(env.gpus)}); request {n + serve + 1}+ GPUs or "
            "lower reward_model_gpus"
        )


def split_reward_model(
    env: Environment, recipe: RecipeKeys, ports: Ports
) -> tuple[Environment, RewardModelPlan | None]:
    """(the environment left for vLLM and training, the reward-model server or None)."""
    if not recipe.reward_model_gpus:
        return env, None
    model = _served_model(recipe)
    gpus: tuple[str, ...] = ()
    if env.gpus:
        _check_fits(env, recipe)
        gpus = env.gpus[-recipe.reward_model_gpus :]
        env = dataclasses.replace(env, gpus=env.gpus[: -recipe.reward_model_gpus])
    host = bind_address(env, env.nodes[0])
    command = (env.python, "-m", SERVER_MODULE, "--model", model, "--port", str(ports.reward_model))
    command += ("--host", host)  # the run's token reaches it in its environment
    server_env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}
    if not gpus:  # on CPU beside the trainers: one thread, the cores are theirs
        server_env["OMP_NUM_THREADS"] = "1"
    server = RewardModelPlan(
        node=env.nodes[0],
        host=host,
        gpus=gpus,
        port=ports.reward_model,
        model=model,
        command=command,
        env=server_env,
        timeout=recipe.vllm_server_timeout,
    )
    return env, server


def with_reward_model(plan: Plan, server: RewardModelPlan | None) -> Plan:
    """The plan with the server, and its URL in the trainers' environment."""
    if server is None:
        return plan
    train = dataclasses.replace(
        plan.train, env={**plan.train.env, REWARD_MODEL_VARIABLE: server.url}
    )
    return dataclasses.replace(plan, train=train, reward_model=server)
