"""The seed guide's environment variables (TRAIN_ENTRYPOINT, VLLM_*), CPU threads from the
allocation, and Slurm resource options passed through `maxent-grpo sbatch` / `submit`."""

from __future__ import annotations

import argparse
import os
import subprocess

import pytest
import submitit

from helpers.paths import MAXENT_GRPO as MAXENT_CLI
from helpers.paths import REPO
from maxent_grpo.launch.launcher import RunRequest, allocated_cpus, prepare
from maxent_grpo.launch.overrides import env_overrides, server_environ
from maxent_grpo.launch.plan import Environment
from maxent_grpo.launch.sbatch import sbatch_command, slurm_resources
from maxent_grpo.launch.submit import SubmitOptions, make_executor, submitit_parameters

GPU_RECIPE = str(REPO / "recipes" / "Qwen2.5-1.5B-Instruct" / "grpo" / "config_math.yaml")
EIGHT_GPUS = Environment(gpus=tuple(str(i) for i in range(8)), nodes=("n0",), cpus=32)


def plan_for(environ: dict, environment: Environment = EIGHT_GPUS, **request):
    # The plan only: this machine may lack the recipe's vLLM/DeepSpeed (test_requirements.py).
    return prepare(RunRequest(recipe=GPU_RECIPE, **request), environ, environment, packages=False)


def test_vllm_tp_size_gives_the_server_two_gpus_and_six_trainers():
    prepared = plan_for({"VLLM_TP_SIZE": "2"})
    assert prepared.plan.server.gpus == ("0", "1")
    assert prepared.plan.train.gpus == ("2", "3", "4", "5", "6", "7")
    assert prepared.plan.train.num_processes == 6
    assert prepared.keys.vllm_tensor_parallel_size == 2
    assert "VLLM_TP_SIZE=2 -> vllm_tensor_parallel_size" in prepared.describe()
    # The trainers parse the same value: the flag is in their command.
    command = list(prepared.plan.train.command)
    assert command[command.index("--vllm_tensor_parallel_size") + 1] == "2"


def test_each_vllm_variable_sets_its_key():
    environ = {
        "VLLM_MODEL": "org/other-model",
        "VLLM_MAX_LEN": "4096",
        "VLLM_MEM_UTIL": "0.55",
        "VLLM_PORT": "8123",
    }
    prepared = plan_for(environ)
    server = prepared.plan.server
    assert "org/other-model" in server.command and prepared.keys.model_name_or_path == (
        "org/other-model"
    )
    assert server.command[server.command.index("--max-model-len") + 1] == "4096"
    assert server.command[server.command.index("--gpu-memory-utilization") + 1] == "0.55"
    assert server.port == 8123 and "--vllm_server_port" in prepared.plan.train.command
    assert len(prepared.notes) == 4


def test_a_command_line_flag_wins_over_the_environment():
    prepared = plan_for({"VLLM_TP_SIZE": "2"}, overrides=("--vllm_tensor_parallel_size", "4"))
    assert prepared.plan.server.gpus == ("0", "1", "2", "3")


def test_train_entrypoint_selects_the_method():
    prepared = plan_for({"TRAIN_ENTRYPOINT": "src/maxent-grpo.py"})
    assert prepared.keys.method == "maxent"
    assert any(part.endswith("maxent-grpo.py") for part in prepared.plan.train.command)
    assert plan_for({"TRAIN_ENTRYPOINT": "src/grpo.py"}).keys.method == "grpo"


def test_train_entrypoint_and_method_must_agree():
    with pytest.raises(Exception, match="TRAIN_ENTRYPOINT selects maxent"):
        plan_for({"TRAIN_ENTRYPOINT": "src/maxent-grpo.py"}, method="grpo")


@pytest.mark.parametrize(
    "variable, value, fragment",
    [
        ("TRAIN_ENTRYPOINT", "train_ppo.py", "set it to one of src/grpo.py, src/maxent-grpo.py"),
        ("VLLM_PORT", "eighty", "is not a TCP port"),
        ("VLLM_TP_SIZE", "0", "vllm_tensor_parallel_size"),
        ("VLLM_MEM_UTIL", "lots", "vllm_server_gpu_memory_utilization"),
    ],
)
def test_a_bad_variable_is_one_line_and_exit_2(variable, value, fragment):
    env = {**os.environ, variable: value, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [MAXENT_CLI, "plan", "--config", GPU_RECIPE, "--gpus", "8"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], lines


def test_the_server_never_sees_our_vllm_port():
    overrides = env_overrides({"VLLM_PORT": "9000"})
    assert overrides.vllm_port == 9000 and overrides.flags == ()
    assert "VLLM_PORT" not in server_environ({"VLLM_PORT": "9000", "PATH": "/bin"})


def test_no_variables_no_overrides():
    assert env_overrides({"PATH": "/bin"}) == env_overrides({})
    assert plan_for({}).notes == ()


# --- threads from the allocation --------------------------------------------------------------


def test_trainer_threads_share_out_the_nodes_cpus():
    # 8 GPUs, 1 for vLLM: 7 trainers on 32 CPUs.
    assert plan_for({}).plan.train.env["OMP_NUM_THREADS"] == "4"
    few = Environment(gpus=EIGHT_GPUS.gpus, nodes=("n0",), cpus=4)
    assert plan_for({}, few).plan.train.env["OMP_NUM_THREADS"] == "1"


def test_cpu_training_threads_count_the_cpu_server(tiny_model):
    smoke_vllm = str(REPO / "recipes" / "smoke" / "config_grpo_vllm.yaml")
    environment = Environment(cpus=6, cpu_processes=2)
    prepared = prepare(RunRequest(recipe=smoke_vllm), {}, environment, packages=False)
    # The recipe's one trainer + the CPU vLLM server on 6 CPUs.
    assert prepared.plan.train.num_processes == 1
    assert prepared.plan.train.env["OMP_NUM_THREADS"] == "3"


def test_slurm_cpu_count_caps_at_the_cpus_we_can_run_on():
    usable = len(os.sched_getaffinity(0))
    assert allocated_cpus({"SLURM_CPUS_PER_TASK": "1"}) == 1
    assert allocated_cpus({"SLURM_CPUS_ON_NODE": str(usable + 100)}) == usable
    assert allocated_cpus({}) == usable


# --- resource options -------------------------------------------------------------------------


def resource_args(**given) -> argparse.Namespace:
    from maxent_grpo.cli import build_parser

    argv = ["sbatch", "--config", GPU_RECIPE]
    for name, value in given.items():
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return build_parser().parse_args(argv)


def test_sbatch_passes_resources_through():
    args = resource_args(
        cpus_per_task=16, mem="128G", partition="p", account="a", qos="high", constraint="h100"
    )
    command = sbatch_command(RunRequest(recipe=GPU_RECIPE), args)
    for expected in (
        "--cpus-per-task=16",
        "--mem=128G",
        "--partition=p",
        "--account=a",
        "--qos=high",
        "--constraint=h100",
    ):
        assert expected in command
    assert "--exclusive" not in command
    assert command.index("--mem=128G") < command.index("training.sh")
    assert "--exclusive" in sbatch_command(
        RunRequest(recipe=GPU_RECIPE), resource_args(exclusive=True)
    )


@pytest.fixture
def srun_on_path(tmp_path, monkeypatch):
    """submitit's Slurm executor refuses to exist without `srun` on PATH; these tests only
    build its sbatch script (the real submissions are in tests/slurm/), so a stand-in that
    is never run: make test runs before any Slurm is installed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text("#!/bin/sh\nexit 1\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.usefixtures("srun_on_path")
def test_submitit_takes_the_same_resources(tmp_path):
    resources = slurm_resources(
        resource_args(cpus_per_task=16, mem="128G", qos="high", constraint="h100", exclusive=True)
    )
    parameters = submitit_parameters(resources)
    assert parameters == {
        "cpus_per_task": 16,
        "slurm_mem": "128G",
        "slurm_qos": "high",
        "slurm_constraint": "h100",
        "slurm_exclusive": True,
    }
    # submitit accepts every name (it raises on an unknown one) and writes them as #SBATCH.
    executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
    executor.update_parameters(**parameters)
    text = submitit.slurm.slurm._make_sbatch_string(
        command="true", folder=tmp_path, **executor._executor.parameters
    )
    for line in (
        "#SBATCH --cpus-per-task=16",
        "#SBATCH --mem=128G",
        "#SBATCH --qos=high",
        "#SBATCH --constraint=h100",
        "#SBATCH --exclusive",
    ):
        assert line in text, text


def test_training_sh_asks_for_cpus_memory_and_a_separate_err():
    header = [
        line
        for line in (REPO / "training.sh").read_text().splitlines()
        if line.startswith("#SBATCH")
    ]
    assert "#SBATCH --cpus-per-task=32" in header
    assert "#SBATCH --mem=0" in header
    assert "#SBATCH --output=logs/slurm_%j.out" in header
    assert "#SBATCH --error=logs/slurm_%j.err" in header
    assert "#SBATCH --open-mode=append" in header


@pytest.mark.usefixtures("srun_on_path")
def test_submit_runs_one_launcher_per_job_and_signals_its_batch_shell(tmp_path):
    options = SubmitOptions(nodes=3, gpus_per_node=8, signal_lead_s=240, folder=str(tmp_path))
    executor = make_executor(options, max_requeues=2, name="r")
    text = submitit.slurm.slurm._make_sbatch_string(
        command="python -m submitit.core._submit x",
        folder=tmp_path,
        **executor._executor.parameters,
    )
    assert "#SBATCH --nodes=3" in text and "#SBATCH --ntasks-per-node=1" in text
    # No srun: submitit would run the launcher once per node, each starting its own server.
    assert "srun" not in text
    assert "#SBATCH --signal=B:USR2@240" in text and "#SBATCH --requeue" in text
    # ...and Python replaces the batch shell, which USR2 would otherwise kill.
    assert executor._executor._submitit_command_str.startswith("exec ")
