"""Issue 57: what every server of a plan binds, and that the token never rides on a command line.

Pure plans (no process): loopback when the whole job is one node (the trainers share the
server's node), the node's own name on several nodes, never every interface; vLLM's token check
(--middleware) on every server command; NCCL sync's rendezvous address bound the same way.
"""

from __future__ import annotations

import dataclasses

from maxent_grpo.launch.plan import Environment, Ports, make_plan
from maxent_grpo.recipe import read_recipe
from maxent_grpo.server_auth import MIDDLEWARE, TOKEN_VARIABLE

PORTS = Ports(vllm=18000, vllm_group=151216, main_process=29555, reward_model=18001)
GRPO = dataclasses.replace(read_recipe([]), path="r.yaml").with_values(
    model_name_or_path="org/model"
)
SERVER = GRPO.with_values(use_vllm=True, vllm_mode="server")
CPU_SERVER = SERVER.with_values(vllm_server_device="cpu", vllm_weight_sync="disk")


def env(n_gpus: int = 0, nodes: int = 1) -> Environment:
    names = ("localhost",) if nodes == 1 else tuple(f"node{i}" for i in range(nodes))
    return Environment(gpus=tuple(str(i) for i in range(n_gpus)), nodes=names)


def flag(command, name: str) -> str:
    command = list(command)
    return command[command.index(name) + 1]


def every_plan():
    yield make_plan(env(4), SERVER, PORTS)
    yield make_plan(env(8, nodes=3), SERVER, PORTS)
    yield make_plan(env(), CPU_SERVER, PORTS)
    yield make_plan(env(nodes=3), CPU_SERVER, PORTS)
    yield make_plan(env(nodes=3), CPU_SERVER.with_values(vllm_nodes=2), PORTS)
    yield make_plan(env(8, nodes=3), SERVER.with_values(vllm_nodes=2), PORTS)


def test_one_node_binds_loopback_and_the_trainers_use_it():
    for plan in (make_plan(env(4), SERVER, PORTS), make_plan(env(), CPU_SERVER, PORTS)):
        assert flag(plan.server.command, "--host") == "127.0.0.1"
        assert plan.server.url == "http://127.0.0.1:18000"
        assert flag(plan.train.command, "--vllm_server_host") == "127.0.0.1"


def test_several_nodes_bind_the_server_node_name_never_every_interface():
    plan = make_plan(env(8, nodes=3), SERVER, PORTS)
    assert flag(plan.server.command, "--host") == "node0"
    assert "--vllm_server_host node0 " in " ".join(plan.train.command)  # srun's bash -c
    servers = make_plan(env(nodes=3), CPU_SERVER.with_values(vllm_nodes=2), PORTS).servers
    assert [flag(s.command, "--host") for s in servers] == ["node0", "node1"]
    assert [s.url for s in servers] == ["http://node0:18000", "http://node1:18000"]


def test_every_server_command_checks_the_token_and_carries_none():
    for plan in every_plan():
        for server in plan.servers:
            assert flag(server.command, "--middleware") == MIDDLEWARE
            assert "0.0.0.0" not in server.command
            assert TOKEN_VARIABLE not in server.env  # the launcher adds it, per attempt
        assert TOKEN_VARIABLE not in plan.train.env
        assert TOKEN_VARIABLE not in plan.describe()


def test_reward_model_server_binds_as_vllm_does():
    recipe = GRPO.with_values(reward_model_gpus=1, reward_funcs=["model:org/rm"])
    plan = make_plan(env(4), recipe, PORTS)
    assert flag(plan.reward_model.command, "--host") == "127.0.0.1"
    assert plan.reward_model.url == "http://127.0.0.1:18001/score"
    cpu = make_plan(env(), recipe, PORTS).reward_model
    assert flag(cpu.command, "--host") == "127.0.0.1"


def test_nccl_rendezvous_binds_the_trainer_node_as_the_servers_bind():
    """vLLM's get_ip reads VLLM_HOST_IP: the address the trainer's weight-group rendezvous
    listens on (its StatelessProcessGroup binds it). Not run here: NCCL needs CUDA."""
    one = make_plan(env(4), SERVER, PORTS)
    assert one.server.weight_sync == "nccl"
    assert one.train.env["VLLM_HOST_IP"] == "127.0.0.1"
    several = make_plan(env(8, nodes=3), SERVER, PORTS)
    assert several.train.env["VLLM_HOST_IP"] == several.train.nodes[0] == "node1"
    disk = make_plan(env(4), SERVER.with_values(vllm_weight_sync="disk"), PORTS)
    assert "VLLM_HOST_IP" not in disk.train.env
