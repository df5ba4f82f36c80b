"""`maxent-grpo sbatch`: check a recipe for the requested allocation, then `sbatch training.sh`.

Plain `sbatch training.sh` works too, but can only find a bad recipe once the job starts;
this checks it before anything is queued.
"""

from __future__ import annotations

import subprocess
import sys

from maxent_grpo.errors import UserError
from maxent_grpo.launch.launcher import LaunchOptions, prepare
from maxent_grpo.launch.plan import Environment


def planned_environment(nodes: int, gpus_per_node: int) -> Environment:
    """The allocation a job will get, for checking the recipe before it is queued."""
    gpus = tuple(str(i) for i in range(gpus_per_node))
    nodes_ = tuple(f"node{i}" for i in range(nodes))
    return Environment(gpus=gpus, nodes=nodes_, python=sys.executable)


def sbatch_command(options: LaunchOptions, args) -> list[str]:
    command = [
        "sbatch",
        "--parsable",
        f"--nodes={args.nodes}",
        f"--gres=gpu:{args.gpus}",
        f"--time={args.time}",
        f"--signal=B:USR1@{args.signal_lead}",
    ]
    for flag, value in (
        ("--partition", args.partition),
        ("--account", args.account),
        ("--array", args.array),
    ):
        if value:
            command.append(f"{flag}={value}")
    command += ["training.sh", "--method", options.method, "--config", options.recipe]
    if options.run_name:
        command += ["--run-name", options.run_name]
    if str(options.logs_dir) != "logs":
        command += ["--logs-dir", str(options.logs_dir)]
    if options.overrides:
        command += ["--", *options.overrides]
    return command


def submit_sbatch(options: LaunchOptions, args, command: list[str]) -> str:
    """Check, then queue; returns the job id. sbatch's own refusal is one line too."""
    prepare(options, environment=planned_environment(args.nodes, args.gpus))
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        reason = " ".join(result.stderr.split()) or f"exit code {result.returncode}"
        raise UserError(f"sbatch refused the job: {reason}")
    return result.stdout.strip().split(";")[0]
