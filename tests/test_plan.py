"""The launch plan (pure): GPUs, nodes, ports and commands for every kind of allocation."""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys

import pytest

from helpers.paths import REPO
from helpers.recipes import SMOKE_VLLM, write_recipe
from maxent_grpo.launch.plan import (
    Environment,
    PlanError,
    Ports,
    make_plan,
    parse_visible_devices,
)
from maxent_grpo.launch.plan.training import CPU_HEAP
from maxent_grpo.methods import METHODS
from maxent_grpo.recipe import RecipeKeys, read_recipe

PORTS = Ports(vllm=18000, vllm_group=151216, main_process=29555)
# Every key at its one default (no recipe file), as the plan reads them.
GRPO = dataclasses.replace(read_recipe([]), path="r.yaml").with_values(
    model_name_or_path="org/model"
)
SERVER = GRPO.with_values(use_vllm=True, vllm_mode="server")
COLOCATE = GRPO.with_values(use_vllm=True, vllm_mode="colocate")
CPU_SERVER = SERVER.with_values(vllm_server_device="cpu", vllm_weight_sync="disk")


def gpus(n: int) -> tuple[str, ...]:
    return tuple(str(i) for i in range(n))


def env(n_gpus: int = 0, nodes: int = 1, ids: tuple[str, ...] | None = None) -> Environment:
    names = ("localhost",) if nodes == 1 else tuple(f"node{i}" for i in range(nodes))
    return Environment(gpus=ids if ids is not None else gpus(n_gpus), nodes=names)


def flag(command, name: str) -> str:
    command = list(command)
    return command[command.index(name) + 1]


def plan_error(environment: Environment, req: RecipeKeys) -> str:
    with pytest.raises(PlanError) as info:
        make_plan(environment, req, PORTS)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- CUDA_VISIBLE_DEVICES -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, ()),
        ("", ()),
        ("0", ("0",)),
        ("0,1,2,3", ("0", "1", "2", "3")),
        ("3,5,7", ("3", "5", "7")),
        (" 3 , 5 ,", ("3", "5")),
        ("-1", ()),
        ("0,-1,2", ("0",)),  # CUDA stops at the first invalid id
        ("NoDevFiles", ()),  # what Slurm sets for a job without GPUs
        (
            "GPU-8f6e1a2b-0000-1111-2222-333344445555,GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeffff0000",
            (
                "GPU-8f6e1a2b-0000-1111-2222-333344445555",
                "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeffff0000",
            ),
        ),
        ("MIG-11111111-2222-3333-4444-555555555555", ("MIG-11111111-2222-3333-4444-555555555555",)),
    ],
)
def test_parse_visible_devices(value, expected):
    assert parse_visible_devices(value) == expected


# --- no server: no vLLM, colocate, external server ------------------------------------------


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("req", [GRPO, COLOCATE], ids=["no-vllm", "colocate"])
def test_without_server_every_gpu_trains(n, req):
    plan = make_plan(env(n), req, PORTS)
    assert plan.server is None and plan.device == "gpu"
    assert plan.train.gpus == gpus(n)
    assert plan.train.num_processes == n
    assert plan.train.env["CUDA_VISIBLE_DEVICES"] == ",".join(gpus(n))
    cmd = plan.train.command
    assert flag(cmd, "--num_processes") == str(n)
    assert ("--multi_gpu" in cmd) == (n > 1)
    assert "--vllm_server_host" not in cmd
    assert cmd[-3:] == (*METHODS["grpo"].entry(), "--config", "r.yaml")


def test_external_server_plans_no_server_and_trains_on_every_gpu():
    req = SERVER.with_values(vllm_server_base_url="http://vllm-box:8000")
    plan = make_plan(env(4), req, PORTS)
    assert plan.server is None
    assert plan.external_server == "http://vllm-box:8000"
    assert plan.train.num_processes == 4
    assert "external, http://vllm-box:8000" in plan.describe()


# --- server on GPU, one node ----------------------------------------------------------------


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("n", range(1, 9))
def test_server_takes_tp_gpus_and_the_rest_train(n, tp):
    req = SERVER.with_values(vllm_tensor_parallel_size=tp)
    if n <= tp:
        message = plan_error(env(n), req)
        assert f"needs {tp} GPU(s) for vLLM plus at least one to train" in message or (
            f"vllm_tensor_parallel_size: {tp} but each node has {n} GPU(s)" in message
        )
        return
    plan = make_plan(env(n), req, PORTS)
    assert plan.server.gpus == gpus(n)[:tp]
    assert plan.server.env["CUDA_VISIBLE_DEVICES"] == ",".join(gpus(n)[:tp])
    assert flag(plan.server.command, "--tensor-parallel-size") == str(tp)
    assert plan.train.gpus == gpus(n)[tp:]
    assert plan.train.env["CUDA_VISIBLE_DEVICES"] == ",".join(gpus(n)[tp:])
    assert plan.train.num_processes == n - tp
    assert flag(plan.train.command, "--num_processes") == str(n - tp)
    assert not set(plan.server.gpus) & set(plan.train.gpus)


def test_too_few_gpus_is_one_clear_line():
    message = plan_error(env(1), SERVER)
    assert "needs 1 GPU(s) for vLLM plus at least one to train" in message
    assert "request 2+ GPUs, or set vllm_mode: colocate" in message
    message = plan_error(env(2), SERVER.with_values(vllm_tensor_parallel_size=4))
    assert "vllm_tensor_parallel_size: 4 but each node has 2 GPU(s) (0,1)" in message


@pytest.mark.parametrize(
    "ids",
    [
        ("3", "5", "7"),
        ("GPU-aaaa-1", "GPU-bbbb-2", "GPU-cccc-3"),
        ("MIG-1", "MIG-2", "MIG-3"),
    ],
)
def test_unusual_device_ids_are_passed_through(ids):
    plan = make_plan(env(ids=ids), SERVER, PORTS)
    assert plan.server.env["CUDA_VISIBLE_DEVICES"] == ids[0]
    assert plan.train.env["CUDA_VISIBLE_DEVICES"] == ",".join(ids[1:])
    assert plan.train.num_processes == 2


def test_hidden_gpus_minus_one_plans_cpu():
    ids = parse_visible_devices("-1")
    assert make_plan(env(ids=ids), GRPO, PORTS).device == "cpu"
    assert "vllm_server_device: cpu" in plan_error(env(ids=ids), SERVER)


def test_server_and_trainer_agree_on_ports_and_host():
    plan = make_plan(env(4), SERVER, PORTS)
    cmd = plan.train.command
    assert flag(plan.server.command, "--port") == "18000"
    # One node: the trainers share it, so the server answers loopback only (issue 57).
    assert flag(plan.server.command, "--host") == "127.0.0.1"
    assert flag(cmd, "--vllm_server_host") == "127.0.0.1"
    assert flag(cmd, "--vllm_server_port") == "18000"
    assert flag(cmd, "--vllm_group_port") == "151216"
    assert flag(cmd, "--main_process_port") == "29555"
    assert plan.server.health_url == "http://127.0.0.1:18000/health"


def test_server_command_has_the_flags_trl_needs():
    plan = make_plan(env(2), SERVER, PORTS)
    cmd = plan.server.command
    assert cmd[:5] == ("python", "-m", "vllm.entrypoints.cli.main", "serve", "org/model")
    assert flag(cmd, "--logprobs-mode") == "processed_logprobs"
    assert flag(cmd, "--max-logprobs") == "-1"
    assert flag(cmd, "--gpu-memory-utilization") == "0.9"
    assert flag(cmd, "--dtype") == "auto"
    assert "--enforce-eager" not in cmd and "--max-model-len" not in cmd
    assert plan.server.env["VLLM_SERVER_DEV_MODE"] == "1"


def test_recipe_keys_reach_the_server_command():
    req = SERVER.with_values(
        vllm_server_gpu_memory_utilization=0.5,
        vllm_server_dtype="bfloat16",
        vllm_server_enforce_eager=True,
        vllm_max_model_length=4096,
        model_revision="abc123",
        trust_remote_code=True,
        vllm_server_timeout=77,
    )
    plan = make_plan(env(2), req, PORTS)
    cmd = plan.server.command
    assert flag(cmd, "--gpu-memory-utilization") == "0.5"
    assert flag(cmd, "--dtype") == "bfloat16"
    assert flag(cmd, "--max-model-len") == "4096"
    assert flag(cmd, "--revision") == "abc123"
    assert "--enforce-eager" in cmd and "--trust-remote-code" in cmd
    assert plan.server.timeout == 77
    assert "timeout 77s" in plan.describe()


def test_nccl_sync_wiring_stand_in_no_cuda():
    """NCCL cannot run here: check what the plan and the trainer config choose for it.

    Server: TRL's NCCL weight-transfer engine and dev mode; trainer: the group port; the
    trainer-side check accepts nccl only with CUDA.
    """
    from maxent_grpo.errors import UserError
    from maxent_grpo.recipe import parse_recipe
    from maxent_grpo.train.vllm_sync import check_weight_sync

    plan = make_plan(env(8), SERVER, PORTS)
    assert plan.server.weight_sync == "nccl"
    assert flag(plan.server.command, "--weight-transfer-config") == '{"backend": "nccl"}'
    assert plan.server.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert flag(plan.train.command, "--vllm_group_port") == str(PORTS.vllm_group)
    assert "weight sync nccl (group port 151216)" in plan.describe()

    recipe = REPO / "recipes" / "Qwen2.5-1.5B-Instruct" / "grpo" / "config_math.yaml"
    training_args = parse_recipe(
        ["--config", str(recipe), "--use_cpu", "true", "--bf16", "false"], world_size=7
    ).training
    assert training_args.vllm_mode == "server" and training_args.vllm_weight_sync == "nccl"
    training_args.use_cpu = False
    assert check_weight_sync(training_args, cuda_available=True) == "nccl"
    with pytest.raises(UserError, match="set vllm_weight_sync: disk"):
        check_weight_sync(training_args, cuda_available=False)


def test_disk_sync_on_gpu_has_no_nccl_engine():
    plan = make_plan(env(2), SERVER.with_values(vllm_weight_sync="disk"), PORTS)
    assert "--weight-transfer-config" not in plan.server.command
    assert plan.server.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert "weight sync disk" in plan.describe() and "group port" not in plan.describe()


def test_num_processes_limits_training():
    plan = make_plan(env(8), SERVER.with_values(num_processes=4), PORTS)
    assert plan.train.num_processes == 4
    message = plan_error(env(4), SERVER.with_values(num_processes=4))
    assert "num_processes: 4 but only 3 GPU(s) are left for training" in message


def test_accelerate_config_replaces_multi_gpu():
    req = SERVER.with_values(accelerate_config="recipes/accelerate_configs/zero2.yaml")
    cmd = make_plan(env(8), req, PORTS).train.command
    assert flag(cmd, "--config_file") == "recipes/accelerate_configs/zero2.yaml"
    assert "--multi_gpu" not in cmd


# --- several nodes --------------------------------------------------------------------------


def srun_parts(command) -> tuple[list[str], list[str]]:
    """(srun options, the per-node command split by the shell) of a multi-node command."""
    assert command[0] == "srun"
    i = list(command).index("bash")
    assert command[i + 1] == "-c"
    return list(command[1:i]), shlex.split(command[i + 2])


@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_multi_node_vllm_on_first_node_training_on_the_others(nodes, tp):
    req = SERVER.with_values(vllm_tensor_parallel_size=tp)
    plan = make_plan(env(8, nodes=nodes), req, PORTS)
    assert plan.server.node == ("localhost" if nodes == 1 else "node0")
    # several nodes: the whole first node serves (8 / tp replicas)
    assert plan.server.gpus == (gpus(8)[:tp] if nodes == 1 else gpus(8))
    if nodes == 1:
        assert plan.train.command[0] != "srun"
        assert plan.train.num_processes == 8 - tp
        return
    train_nodes = tuple(f"node{i}" for i in range(1, nodes))
    assert plan.train.nodes == train_nodes
    assert plan.train.gpus == gpus(8)
    assert plan.train.num_machines == nodes - 1
    assert plan.train.num_processes == 8 * (nodes - 1)
    options, per_node = srun_parts(plan.train.command)
    assert f"--nodes={nodes - 1}" in options and f"--ntasks={nodes - 1}" in options
    assert "--ntasks-per-node=1" in options and "--relative=1" in options
    assert per_node[0] == "exec"
    assert flag(per_node, "--num_machines") == str(nodes - 1)
    assert flag(per_node, "--num_processes") == str(8 * (nodes - 1))
    assert flag(per_node, "--main_process_ip") == "node1"
    assert flag(per_node, "--machine_rank") == "$SLURM_PROCID"
    assert flag(per_node, "--vllm_server_host") == "node0"


# --- server replicas (vllm_data_parallel_size) -----------------------------------------------


@pytest.mark.parametrize(("n", "tp", "dp"), [(8, 1, 2), (8, 2, 2), (8, 1, 7), (4, 1, 3)])
def test_one_node_first_tp_x_dp_gpus_serve_and_the_rest_train(n, tp, dp):
    req = SERVER.with_values(vllm_tensor_parallel_size=tp, vllm_data_parallel_size=dp)
    plan = make_plan(env(n), req, PORTS)
    assert plan.server.gpus == gpus(n)[: tp * dp]
    assert plan.server.env["CUDA_VISIBLE_DEVICES"] == ",".join(gpus(n)[: tp * dp])
    assert flag(plan.server.command, "--tensor-parallel-size") == str(tp)
    assert flag(plan.server.command, "--data-parallel-size") == str(dp)
    assert plan.train.gpus == gpus(n)[tp * dp :]
    assert plan.train.num_processes == n - tp * dp
    assert plan.idle == ()
    assert f"tensor parallel {tp} x data parallel {dp}" in plan.describe()


def test_one_node_defaults_to_one_replica():
    plan = make_plan(env(8), SERVER, PORTS)
    assert plan.server.gpus == ("0",) and plan.server.data_parallel == 1
    assert flag(plan.server.command, "--data-parallel-size") == "1"
    assert plan.train.num_processes == 7 and plan.idle == ()
    why = "vllm_data_parallel_size unset: one replica on one node, whose other GPUs train"
    assert f"  replicas: 1 ({why})" in plan.describe().splitlines()


def test_one_node_replicas_need_a_gpu_left_to_train():
    message = plan_error(env(4), SERVER.with_values(vllm_data_parallel_size=4))
    assert "needs 4 GPU(s) for vLLM plus at least one to train" in message
    assert "lower vllm_data_parallel_size" in message


def test_whole_node_generation_two_nodes_nothing_idle():
    """The issue's plan: `plan --gpus 8 --nodes 2`: 8 replicas on node0, 8 trainers on node1."""
    plan = make_plan(env(8, nodes=2), SERVER, PORTS)
    assert (plan.server.node, plan.server.gpus) == ("node0", gpus(8))
    assert flag(plan.server.command, "--data-parallel-size") == "8"
    assert flag(plan.server.command, "--tensor-parallel-size") == "1"
    assert plan.train.nodes == ("node1",) and plan.train.gpus == gpus(8)
    assert plan.train.num_processes == 8
    assert plan.idle == ()
    assert plan.describe().endswith("idle: none")
    why = "vllm_data_parallel_size unset: the whole first node (8 GPUs / tensor parallel 1)"
    assert f"  replicas: 8 ({why})" in plan.describe().splitlines()


@pytest.mark.parametrize(("tp", "dp"), [(2, 4), (4, 2), (8, 1)])
def test_whole_node_generation_with_tensor_parallel(tp, dp):
    plan = make_plan(env(8, nodes=3), SERVER.with_values(vllm_tensor_parallel_size=tp), PORTS)
    assert plan.server.gpus == gpus(8)
    assert (plan.server.tensor_parallel, plan.server.data_parallel) == (tp, dp)
    assert flag(plan.server.command, "--data-parallel-size") == str(dp)
    assert plan.idle == ()


def test_an_explicit_replica_count_that_leaves_gpus_idle_is_named():
    plan = make_plan(env(8, nodes=2), SERVER.with_values(vllm_data_parallel_size=2), PORTS)
    assert plan.server.gpus == ("0", "1")
    assert plan.idle == (
        "node node0 GPUs 2,3,4,5,6,7 (set vllm_data_parallel_size: 8 (or unset it) to serve "
        "with the whole node)",
    )
    assert "idle: node node0 GPUs 2,3,4,5,6,7" in plan.describe()
    assert "  replicas: 2 (vllm_data_parallel_size)" in plan.describe().splitlines()


def test_tp_not_dividing_the_node_leaves_the_remainder_idle():
    plan = make_plan(env(8, nodes=2), SERVER.with_values(vllm_tensor_parallel_size=3), PORTS)
    assert plan.server.gpus == gpus(6)
    assert plan.idle == ("node node0 GPUs 6,7 (use a vllm_tensor_parallel_size that divides 8)",)


def test_fewer_trainers_than_gpus_are_named_idle():
    plan = make_plan(env(8), SERVER.with_values(num_processes=4), PORTS)
    assert plan.idle == (
        "node localhost GPUs 5,6,7 (unset num_processes, or raise it, to train on them)",
    )


def test_replicas_beyond_a_node_are_one_clear_line():
    message = plan_error(env(8, nodes=2), SERVER.with_values(vllm_data_parallel_size=9))
    assert "vllm_tensor_parallel_size: 1 x vllm_data_parallel_size: 9 = 9 server GPUs" in message
    assert "lower vllm_data_parallel_size to 8 or less" in message


def test_cpu_server_replicas_reach_the_command():
    plan = make_plan(env(0), CPU_SERVER.with_values(vllm_data_parallel_size=2), PORTS)
    assert flag(plan.server.command, "--data-parallel-size") == "2"
    assert plan.server.gpus == () and plan.idle == ()
    # Replicas are engine processes: vLLM's multiprocess executor, as it starts them.
    assert "--distributed-executor-backend" not in plan.server.command
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in plan.server.env


def test_one_cpu_server_runs_the_model_in_its_engine_process():
    """No worker process whose engine spins waiting for it; GPU servers keep vLLM's default."""
    cpu = make_plan(env(0), CPU_SERVER, PORTS).server
    assert flag(cpu.command, "--distributed-executor-backend") == "uni"
    assert cpu.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # or vLLM's CPU platform uses mp
    gpu = make_plan(env(8), SERVER, PORTS).server
    assert "--distributed-executor-backend" not in gpu.command
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in gpu.env


LORA = SERVER.with_values(use_peft=True, vllm_weight_sync="lora", lora_r=4)


def test_lora_sync_starts_the_server_with_runtime_lora():
    plan = make_plan(env(8), LORA, PORTS)
    command = plan.server.command
    assert "--enable-lora" in command and flag(command, "--max-lora-rank") == "8"
    assert "--weight-transfer-config" not in command
    assert plan.server.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"


@pytest.mark.parametrize(("rank", "served"), [(1, 1), (4, 8), (16, 16), (17, 32), (300, 320)])
def test_lora_rank_rounds_up_to_what_vllm_accepts(rank, served):
    plan = make_plan(env(2), LORA.with_values(lora_r=rank), PORTS)
    assert flag(plan.server.command, "--max-lora-rank") == str(served)


def test_lora_sync_serves_one_replica_even_on_several_nodes():
    plan = make_plan(env(8, nodes=2), LORA, PORTS)
    assert plan.server.gpus == ("0",) and plan.server.data_parallel == 1
    assert plan.idle == (
        "node node0 GPUs 1,2,3,4,5,6,7 (vllm_weight_sync: lora serves one replica; disk or "
        "nccl sync serve more)",
    )
    why = "vllm_data_parallel_size unset: one replica, the one a LoRA adapter reaches"
    assert f"  replicas: 1 ({why})" in plan.describe().splitlines()
    message = plan_error(env(8), LORA.with_values(vllm_data_parallel_size=2))
    assert "reaches" not in message and "set vllm_data_parallel_size: 1" in message


def test_lora_sync_needs_peft_and_works_on_a_cpu_server():
    assert "use_peft: true" in plan_error(env(8), LORA.with_values(use_peft=False))
    plan = make_plan(env(0), LORA.with_values(vllm_server_device="cpu"), PORTS)
    assert "--enable-lora" in plan.server.command


def sbatch_header(path) -> dict[str, str]:
    lines = (REPO / path).read_text().splitlines()
    options = [line.split(None, 1)[1] for line in lines if line.startswith("#SBATCH ")]
    return dict(option.lstrip("-").split("=", 1) for option in options if "=" in option)


@pytest.mark.parametrize(
    ("script", "server_gpus", "trainers"),
    [("slurm/multinode.sbatch", 8, 8), ("training.sh", 1, 7)],
)
def test_slurm_headers_as_written_leave_no_gpu_idle(script, server_gpus, trainers):
    """The header's allocation, the plan and `check` agree: nothing idle as shipped."""
    header = sbatch_header(script)
    nodes, per_node = int(header["nodes"]), int(header["gres"].rsplit(":", 1)[1])
    recipe = read_recipe(
        ["--config", str(REPO / "recipes/Qwen2.5-1.5B-Instruct/grpo/config_math.yaml")]
    )
    plan = make_plan(env(per_node, nodes=nodes), recipe, PORTS)
    assert len(plan.server.gpus) == server_gpus
    assert plan.train.num_processes == trainers
    assert plan.idle == ()


@pytest.mark.parametrize("nodes", [2, 4])
def test_multi_node_without_server_trains_on_every_node(nodes):
    plan = make_plan(env(8, nodes=nodes), GRPO, PORTS)
    assert plan.train.nodes == tuple(f"node{i}" for i in range(nodes))
    assert plan.train.num_processes == 8 * nodes
    options, per_node = srun_parts(plan.train.command)
    assert not any(o.startswith("--relative") for o in options)
    assert flag(per_node, "--main_process_ip") == "node0"


def test_multi_node_machine_rank_is_each_tasks_rank(tmp_path):
    """Run the per-node command as srun would on each node: the rank comes out right."""
    fake_python = tmp_path / "python"
    fake_python.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake_python.chmod(0o755)
    environment = dataclasses.replace(env(4, nodes=3), python=str(fake_python))
    plan = make_plan(environment, SERVER, PORTS)
    i = list(plan.train.command).index("bash")
    script = plan.train.command[i + 2]
    for rank in range(2):
        out = subprocess.run(
            ["bash", "-c", script],
            env={**os.environ, "SLURM_PROCID": str(rank)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        assert flag(out, "--machine_rank") == str(rank)
        assert flag(out, "--num_machines") == "2"


def test_multi_node_tp_larger_than_a_node_is_an_error():
    message = plan_error(env(4, nodes=2), SERVER.with_values(vllm_tensor_parallel_size=8))
    assert "vllm_tensor_parallel_size: 8 but each node has 4 GPU(s)" in message


def test_multi_node_num_processes_must_divide_over_nodes():
    message = plan_error(env(8, nodes=3), SERVER.with_values(num_processes=15))
    assert "does not divide evenly over the 2 training nodes" in message


# --- CPU ------------------------------------------------------------------------------------


def test_cpu_without_vllm():
    plan = make_plan(env(0), GRPO, PORTS)
    assert plan.device == "cpu" and plan.server is None
    assert plan.train.num_processes == 2
    assert plan.train.env == {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", **CPU_HEAP}
    assert "--multi_gpu" in plan.train.command  # gloo on CPU needs it for 2 processes


@pytest.mark.parametrize("nodes", [2, 3])
def test_cpu_training_across_nodes_one_process_per_node(nodes):
    plan = make_plan(env(0, nodes=nodes), GRPO, PORTS)
    assert plan.train.nodes == tuple(f"node{i}" for i in range(nodes))
    assert plan.train.num_processes == nodes and plan.train.num_machines == nodes
    options, per_node = srun_parts(plan.train.command)
    assert f"--nodes={nodes}" in options and "--ntasks-per-node=1" in options
    assert flag(per_node, "--num_machines") == str(nodes)
    assert flag(per_node, "--main_process_ip") == "node0"
    assert flag(per_node, "--machine_rank") == "$SLURM_PROCID"
    assert "--multi_gpu" in per_node  # gloo


def test_cpu_server_has_the_first_node_and_the_others_train():
    plan = make_plan(env(0, nodes=3), CPU_SERVER, PORTS)
    assert plan.server.node == "node0" and plan.train.nodes == ("node1", "node2")
    options, per_node = srun_parts(plan.train.command)
    assert "--relative=1" in options and "--nodes=2" in options
    assert flag(per_node, "--main_process_ip") == "node1"
    assert flag(per_node, "--vllm_server_host") == "node0"
    # a CPU server has no GPUs to fill: one replica unless the recipe asks for more
    assert flag(plan.server.command, "--data-parallel-size") == "1"
    why = "vllm_data_parallel_size unset: one replica on a CPU server"
    assert f"  replicas: 1 ({why})" in plan.describe().splitlines()
    uneven = CPU_SERVER.with_values(num_processes=3)
    assert "use a multiple of 2" in plan_error(env(0, nodes=3), uneven)


def test_cpu_server_needs_an_opt_in():
    message = plan_error(env(0), SERVER)
    assert "vllm_server_device: cpu and vllm_weight_sync: disk" in message


def test_cpu_server_plan():
    plan = make_plan(env(0), CPU_SERVER.with_values(num_processes=1), PORTS)
    assert plan.device == "cpu"
    assert plan.server.device == "cpu" and plan.server.gpus == ()
    assert plan.server.env == {
        "CUDA_VISIBLE_DEVICES": "",
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    assert "--weight-transfer-config" not in plan.server.command
    assert flag(plan.server.command, "--tensor-parallel-size") == "1"
    cmd = plan.train.command
    assert flag(cmd, "--num_processes") == "1" and "--multi_gpu" not in cmd
    assert flag(cmd, "--vllm_server_port") == "18000"
    assert "CPU (vLLM's CPU build)" in plan.describe()


def test_cpu_server_with_nccl_is_an_error():
    req = SERVER.with_values(vllm_server_device="cpu")
    assert "set vllm_weight_sync: disk" in plan_error(env(0), req)
    assert "set vllm_weight_sync: disk" in plan_error(env(4), req)


def test_cpu_server_tp_must_be_one():
    req = CPU_SERVER.with_values(vllm_tensor_parallel_size=2)
    assert "set it to 1" in plan_error(env(0), req)


def test_cpu_server_leaves_every_gpu_to_training():
    plan = make_plan(env(4), CPU_SERVER, PORTS)
    assert plan.server.device == "cpu" and plan.server.env["CUDA_VISIBLE_DEVICES"] == ""
    assert plan.device == "gpu" and plan.train.gpus == gpus(4)


# --- the edges: environment and `maxent-grpo plan` ------------------------------------------


def test_environment_reads_slurm_nodes_through_scontrol(tmp_path, monkeypatch):
    from maxent_grpo.launch.launcher import environment_from_os

    fake = tmp_path / "scontrol"
    fake.write_text(
        '#!/bin/sh\n[ "$1 $2 $3" = "show hostnames gpu[01-03]" ] || exit 1\n'
        'printf "gpu01\\ngpu02\\ngpu03\\n"\n'
    )
    fake.chmod(0o755)
    path = f"{tmp_path}{os.pathsep}{os.environ['PATH']}"
    slurm = {"PATH": path, "SLURM_JOB_NODELIST": "gpu[01-03]", "SLURM_JOB_NUM_NODES": "3"}
    monkeypatch.setenv("PATH", path)
    assert environment_from_os({**slurm, "CUDA_VISIBLE_DEVICES": "0,1"}).nodes == (
        "gpu01",
        "gpu02",
        "gpu03",
    )
    one = {**slurm, "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "gpu01"}
    assert environment_from_os(one).nodes == ("localhost",)
    assert environment_from_os({**slurm, "MAXENT_GRPO_NODES": "a b"}).nodes == ("a", "b")
    assert environment_from_os({}).gpus == ()


def test_maxent_grpo_plan_prints_the_cpu_server_plan(tiny_model):
    recipe = REPO / "recipes" / "smoke" / "config_grpo_vllm.yaml"
    out = subprocess.run(
        [sys.executable, "-m", "maxent_grpo.cli", "plan", "--config", str(recipe)],
        cwd=REPO,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "vllm server: node localhost, CPU (vLLM's CPU build)" in text
    assert "weight sync disk" in text
    assert "--enforce-eager" in text and "--dtype float32" in text
    assert "vllm.entrypoints.cli.main serve" in text
    assert "--vllm_server_port" in text


def test_maxent_grpo_plan_rejects_nccl_on_cpu(tiny_model, tmp_path):
    path = write_recipe(tmp_path, base=SMOKE_VLLM, vllm_weight_sync="nccl")
    out = subprocess.run(
        [sys.executable, "-m", "maxent_grpo.cli", "plan", "--config", str(path)],
        cwd=REPO,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error: ")
    assert "set vllm_weight_sync: disk" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_installed_package_trains_through_the_module_entry_point(monkeypatch, tmp_path):
    import maxent_grpo.methods as methods

    monkeypatch.setattr(methods, "_SRC_DIR", tmp_path)  # no src/grpo.py: a non-editable install
    cmd = make_plan(env(2), GRPO, PORTS).train.command
    assert cmd[-6:] == ("--module", "maxent_grpo.train", "--method", "grpo", "--config", "r.yaml")
    maxent = dataclasses.replace(GRPO, method="maxent")
    assert "--method maxent" in shlex.join(make_plan(env(2), maxent, PORTS).train.command)


def test_a_user_error_is_recorded_in_the_run_it_names(tmp_path):
    from maxent_grpo.errors import UserError
    from maxent_grpo.launch.attempt import Attempt
    from maxent_grpo.launch.launcher import RunRequest
    from maxent_grpo.rundir.events import emit, read_events

    path = write_recipe(tmp_path, num_generation=4)  # typo: unknown key
    attempt = Attempt(RunRequest(str(path), logs_dir=tmp_path / "logs"), environ={})
    with pytest.raises(UserError, match="unknown key 'num_generation'"):
        attempt.run()
    # A start that never began leaves no run behind (issue 26.4) ...
    assert not (tmp_path / "out").exists() and not (tmp_path / "logs").exists()
    # ... a run that exists gets the error in its event log.
    emit(tmp_path / "out", "stop_request", reason="an earlier attempt")
    attempt = Attempt(RunRequest(str(path), logs_dir=tmp_path / "logs"), environ={})
    with pytest.raises(UserError, match="unknown key 'num_generation'"):
        attempt.run()
    _, event = read_events(tmp_path / "out")
    assert event["event"] == "outcome" and event["outcome"] == "user_error"
    assert "unknown key 'num_generation'" in event["reason"] and event["code"] == 2


def test_cpu_training_fixes_the_heap_unless_the_recipe_tunes_it():
    """CPU trainers get glibc's heap thresholds fixed (page faults a step: CPU_HEAP's
    comment); a recipe's env: block that sets either one keeps its own, and GPU trainers get
    neither."""
    assert CPU_HEAP.items() <= make_plan(env(0), GRPO, PORTS).train.env.items()
    own = dataclasses.replace(GRPO, env={"MALLOC_TRIM_THRESHOLD_": "0"})
    assert not CPU_HEAP.keys() & make_plan(env(0), own, PORTS).train.env.keys()
    assert not CPU_HEAP.keys() & make_plan(env(4), GRPO, PORTS).train.env.keys()
