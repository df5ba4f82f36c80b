"""The in-allocation launcher: recipe -> checks -> plan -> (server) -> accelerate launch -> wait.

training.sh (local or under sbatch), the submitit launcher and `maxent-grpo run` all call
`launch()`. Effects live here; decisions live in plan.py, configs.py and checkpoints.py.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.checkpoints import run_is_complete
from maxent_grpo.launch.plan import (
    Environment,
    LaunchRequest,
    Plan,
    Ports,
    make_plan,
    parse_visible_devices,
)
from maxent_grpo.launch.processes import Child, free_port
from maxent_grpo.tiny_model import DEFAULT_TINY_MODEL_DIR, ensure_tiny_model

SRC_DIR = Path(__file__).resolve().parents[2]
METHODS = {"grpo": "grpo.py", "maxent": "maxent-grpo.py"}


def recipe_types(method: str):
    from maxent_grpo import configs

    if method == "maxent":
        from maxent_grpo.maxent.config import MAXENT_TYPES

        return MAXENT_TYPES
    return configs.GRPO_TYPES


@dataclass(frozen=True)
class LaunchOptions:
    recipe: str
    method: str = "grpo"
    run_name: str | None = None
    overrides: tuple[str, ...] = ()
    logs_dir: Path = Path("logs")


def environment_from_os(environ=os.environ) -> Environment:
    """What this job was given, read from CUDA_VISIBLE_DEVICES and Slurm's variables."""
    gpus = parse_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"))
    nodes = tuple(environ.get("MAXENT_GRPO_NODES", "").split()) or ("localhost",)
    return Environment(gpus=gpus, nodes=nodes, python=sys.executable)


def _run_overrides(options: LaunchOptions) -> tuple[str, ...]:
    if not options.run_name:
        return options.overrides
    output_dir = str(Path("outputs") / options.run_name)
    return ("--output_dir", output_dir, "--run_name", options.run_name) + options.overrides


def _request(options: LaunchOptions, values, argv: list[str]) -> LaunchRequest:
    return LaunchRequest(
        recipe=options.recipe,
        entry_script=str(SRC_DIR / METHODS[options.method]),
        use_vllm=values.use_vllm,
        vllm_mode=values.vllm_mode,
        vllm_tensor_parallel_size=values.vllm_tensor_parallel_size,
        num_processes=values.num_processes,
        accelerate_config=values.accelerate_config,
        model=values.model_name_or_path or "",
        max_model_len=values.vllm_max_model_length,
        vllm_gpu_memory_utilization=values.vllm_server_gpu_memory_utilization,
        extra_args=tuple(argv[2:]),
    )


def prepare(options: LaunchOptions, environ=os.environ) -> tuple[Plan, tuple]:
    """Everything before a process starts: parse, make the tiny model if asked, plan, check.

    Raises UserError (one line) for anything wrong with the recipe or the allocation.
    """
    from maxent_grpo.configs import parse_recipe, recipe_values
    from maxent_grpo.preflight import check_recipe

    types = recipe_types(options.method)
    argv = ["--config", options.recipe, *_run_overrides(options)]
    values = recipe_values(argv, types)
    if values.model_name_or_path and Path(values.model_name_or_path) == DEFAULT_TINY_MODEL_DIR:
        ensure_tiny_model(DEFAULT_TINY_MODEL_DIR)
    ports = Ports(vllm=free_port(), vllm_group=free_port(), main_process=free_port())
    plan = make_plan(environment_from_os(environ), _request(options, values, argv), ports)
    check_argv = argv
    if plan.device == "cpu" or not _cuda_here():
        # A GPU recipe is checked on a login node too: parse it as if on CPU (bf16 etc.).
        check_argv = [*argv, "--use_cpu", "true"]
    parsed = parse_recipe(check_argv, types, world_size=plan.train.num_processes)
    script_args, training_args, model_args = parsed[:3]
    mixture = check_recipe(script_args, training_args, model_args)
    parsed = (dataclasses.replace(script_args, dataset_mixture=mixture), *parsed[1:])
    return plan, parsed


def _cuda_here() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def log_path(logs_dir: Path, run_name: str, role: str, environ=os.environ) -> Path:
    """logs/<run>_<jobid>_<time>_<role>.log: one file per attempt, never truncated."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    job = environ.get("SLURM_ARRAY_JOB_ID") or environ.get("SLURM_JOB_ID")
    parts = [run_name, f"job{job}" if job else None, stamp, role]
    return Path(logs_dir) / ("_".join(p for p in parts if p) + ".log")


class _Signals:
    """Forward SIGTERM/SIGINT/SIGUSR1 to the children; remember what arrived."""

    FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

    def __init__(self, children: list[Child]):
        self.children = children
        self.received: list[int] = []
        self._previous = {}

    def __enter__(self):
        for signum in self.FORWARDED:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, _frame):
        self.received.append(signum)
        for child in self.children:
            child.signal(signum)

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def launch(options: LaunchOptions, environ=os.environ) -> int:
    """Run one attempt of a training job in this allocation; returns the exit code."""
    plan, parsed = prepare(options, environ)
    training_args = parsed[1]
    output_dir = Path(training_args.output_dir)
    run_name = options.run_name or output_dir.name
    if run_is_complete(output_dir):
        print(f"{output_dir} already holds a completed run; nothing to do.")
        return 0

    print(plan.describe(), flush=True)
    train_log = log_path(options.logs_dir, run_name, "train", environ)
    env = {**environ, **plan.train.env, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    trainer = Child("train", plan.train.command, train_log, env=env, echo=True)
    with _Signals([trainer]):
        try:
            code = trainer.wait()
        finally:
            trainer.stop()
    elapsed = time.monotonic() - started
    print(f"training exited with code {code} after {elapsed:.1f}s")
    print(f"log: {train_log}")
    if code == 0 and run_is_complete(output_dir):
        print(f"model: {output_dir}")
    return code
