"""Several vLLM servers (vllm_nodes / VLLM_NODES): one per serving node, training on the rest,
what does not fit refused in one line, what is idle named. Pure planning, no process."""

from __future__ import annotations

import pytest

from helpers.paths import REPO
from maxent_grpo.errors import UserError
from maxent_grpo.launch.launcher import RunRequest, prepare
from maxent_grpo.launch.plan import SERVERS_VARIABLE, Environment, make_plan
from test_plan import CPU_SERVER, PORTS, SERVER, env, gpus, plan_error

GPU_RECIPE = str(REPO / "recipes" / "Qwen2.5-1.5B-Instruct" / "grpo" / "config_math.yaml")


def four_nodes_of_eight() -> Environment:
    return Environment(gpus=gpus(8), nodes=tuple(f"node{i}" for i in range(4)), cpus=32)


def test_vllm_nodes_2_of_4_serves_on_two_whole_nodes_and_trains_16_on_the_others():
    """The issue's plan: `VLLM_NODES=2 maxent-grpo plan --config <math> --gpus 8 --nodes 4`."""
    environ = {"VLLM_NODES": "2"}
    prepared = prepare(
        RunRequest(recipe=GPU_RECIPE), environ, four_nodes_of_eight(), packages=False
    )
    plan = prepared.plan
    assert prepared.keys.vllm_nodes == 2
    assert [(s.node, s.gpus, s.data_parallel) for s in plan.servers] == [
        ("node0", gpus(8), 8),
        ("node1", gpus(8), 8),
    ]
    assert plan.train.nodes == ("node2", "node3") and plan.train.num_processes == 16
    assert plan.idle == ()
    text = prepared.describe()
    assert [line.split(",")[0] for line in text.splitlines() if line.startswith("vllm server")] == [
        "vllm server: node node0",
        "vllm server: node node1",
    ]
    assert "router: " in text and "idle: none" in text
    assert "VLLM_NODES=2 -> vllm_nodes" in text


def test_each_server_node_gets_its_own_step_group_port_and_the_trainers_every_address():
    plan = make_plan(env(8, nodes=3), SERVER.with_values(vllm_nodes=2), PORTS)
    first, second = plan.servers
    # The launcher runs on the first node: its server directly, the second through srun there.
    assert first.command[0] != "srun"
    assert second.command[:5] == (
        "srun",
        "--nodes=1",
        "--ntasks=1",
        "--relative=1",
        "--kill-on-bad-exit=1",
    )
    # Same server, same port, on its own node, bound to that node's address (issue 57).
    own = list(second.command[5:])
    own[own.index("--host") + 1] = "node0"
    assert first.command == tuple(own)
    assert second.command[second.command.index("--host") + 1] == "node1"
    assert (first.group_port, second.group_port) == (PORTS.vllm_group, PORTS.vllm_group + 1)
    assert plan.train.env[SERVERS_VARIABLE] == "http://node0:18000,http://node1:18000"
    assert plan.train.nodes == ("node2",)
    assert "--relative=2" in plan.train.command


def test_one_server_node_is_todays_plan():
    plan = make_plan(env(8, nodes=3), SERVER, PORTS)
    assert plan.servers == (plan.server,) and plan.more_servers == ()
    assert SERVERS_VARIABLE not in plan.train.env
    assert "router:" not in plan.describe()


def test_cpu_servers_on_two_nodes_train_on_the_third():
    """The namespace cluster's shape: vLLM's CPU build on node0 and node1, training on node2."""
    plan = make_plan(env(0, nodes=3), CPU_SERVER.with_values(vllm_nodes=2), PORTS)
    assert [(s.node, s.device, s.gpus) for s in plan.servers] == [
        ("node0", "cpu", ()),
        ("node1", "cpu", ()),
    ]
    assert plan.device == "cpu" and plan.train.nodes == ("node2",)
    assert plan.train.num_processes == Environment().cpu_processes  # one training node


@pytest.mark.parametrize("nodes", [1, 2])
def test_no_node_left_to_train_is_one_line(nodes):
    message = plan_error(env(8, nodes=nodes), SERVER.with_values(vllm_nodes=2))
    assert f"vllm_nodes: 2 but the job has {nodes} node(s)" in message
    assert "request 3+ nodes" in message


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"use_vllm": False}, "needs vllm servers"),
        ({"vllm_mode": "colocate"}, "needs vllm servers"),
        ({"vllm_server_base_url": "http://elsewhere:8000"}, "vllm_server_base_url"),
    ],
)
def test_vllm_nodes_that_would_be_ignored_is_refused(changes, expected):
    message = plan_error(env(8, nodes=3), SERVER.with_values(vllm_nodes=2, **changes))
    assert expected in message and "vllm_nodes: 2" in message


def test_vllm_nodes_below_one_is_refused_when_read():
    with pytest.raises(UserError, match="vllm_nodes"):
        SERVER.with_values(vllm_nodes=0)


def test_replicas_short_of_each_serving_node_are_named_idle_per_node():
    req = SERVER.with_values(vllm_nodes=2, vllm_data_parallel_size=6)
    plan = make_plan(env(8, nodes=3), req, PORTS)
    hint = "set vllm_data_parallel_size: 8 (or unset it) to serve with the whole node"
    assert plan.idle == (f"node node0 GPUs 6,7 ({hint})", f"node node1 GPUs 6,7 ({hint})")


def test_cpu_servers_beside_gpus_name_the_serving_nodes_gpus_idle():
    plan = make_plan(env(2, nodes=3), CPU_SERVER.with_values(vllm_nodes=2), PORTS)
    assert plan.train.nodes == ("node2",) and plan.train.gpus == gpus(2)
    assert [line.split(" (")[0] for line in plan.idle] == [
        "node node0 GPUs 0,1",
        "node node1 GPUs 0,1",
    ]
    assert "CPU vLLM server" in plan.idle[0]


def test_a_replica_count_beyond_a_node_is_refused_for_every_server_node():
    message = plan_error(
        env(8, nodes=3), SERVER.with_values(vllm_nodes=2, vllm_data_parallel_size=9)
    )
    assert "= 9 server GPUs but each node has 8" in message
