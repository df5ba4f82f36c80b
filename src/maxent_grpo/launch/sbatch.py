"""`maxent-grpo sbatch`: check a recipe for the requested allocation, then `sbatch training.sh`.

Plain `sbatch training.sh` works too, but can only find a bad recipe once the job starts;
this checks it before anything is queued.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from maxent_grpo.errors import UserError
from maxent_grpo.launch.attempt import declared_output_dir
from maxent_grpo.launch.init_from import init_note
from maxent_grpo.launch.launcher import Prepared, RunRequest, prepare
from maxent_grpo.launch.plan import Environment, parse_visible_devices
from maxent_grpo.launch.requirements import (
    check_installed,
    checked_elsewhere,
    job_installs,
    recipe_values,
)
from maxent_grpo.recipe.problems import collecting, rule
from maxent_grpo.rundir.sweeps import JOB_NAME


def planned_environment(nodes: int, gpus_per_node: int) -> Environment:
    """The allocation a job will get, for checking the recipe before it is queued."""
    gpus = tuple(str(i) for i in range(gpus_per_node))
    nodes_ = tuple(f"node{i}" for i in range(nodes))
    return Environment(gpus=gpus, nodes=nodes_, python=sys.executable)


def check_for(
    request: RunRequest, environment: Environment | None, environ=os.environ
) -> tuple[Prepared, list[str]]:
    """The one verdict of `check`, `sbatch`, `submit` and `migrate` on a recipe for an
    allocation (None: this machine's), every problem at once, and its notes.

    Planned for GPUs from a machine that sees none (a login node): the job's node installs the
    extras the recipe needs (checked_elsewhere), so only what no extra installs is checked here
    and a note names the rest.
    """
    visible = parse_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"))
    elsewhere = environment is not None and checked_elsewhere(len(environment.gpus), visible)
    path, values = recipe_values(request.recipe, ["--", *request.overrides])
    with collecting(request.recipe):
        if elsewhere:
            with rule(path):
                check_installed(path, values, deferred=True)
        # full: the trainers' checks too (TRL's own included), which the launcher leaves to them
        prepared = prepare(request, environment=environment, full=True, packages=not elsewhere)
    notes = [*prepared.keys.notes, *(f"idle GPUs: {line}" for line in prepared.plan.idle)]
    if init := init_note(request):
        notes.append(init)
    if elsewhere and (installs := job_installs(path, values)):
        notes.append(installs)
    return prepared, notes


def require_slurm(command: str) -> None:
    """sbatch on PATH, asked before the recipe is checked: off a login node that is the news."""
    if shutil.which("sbatch") is None:
        raise UserError(
            f"maxent-grpo {command}: sbatch is not on PATH; submit from a Slurm login node "
            "(bash training.sh runs locally)"
        )


# sbatch options passed through as given (`maxent-grpo sbatch|submit --<name>`).
RESOURCE_OPTIONS = ("cpus-per-task", "mem", "partition", "account", "qos", "constraint")


def slurm_resources(args) -> dict[str, str | bool]:
    """The resource options the command line gave, by sbatch option name."""
    given: dict[str, str | bool] = {}
    for name in RESOURCE_OPTIONS:
        value = getattr(args, name.replace("-", "_"))
        if value is not None:
            given[name] = str(value)
    if args.exclusive:
        given["exclusive"] = True
    return given


def sbatch_flags(resources: dict[str, str | bool]) -> list[str]:
    """--name=value per option (--exclusive alone); they override training.sh's header."""
    return [f"--{k}" if v is True else f"--{k}={v}" for k, v in resources.items()]


def sbatch_command(request: RunRequest, args, job_name: str | None = None) -> list[str]:
    """job_name: default `maxent-grpo:<run>`, by which `maxent-grpo runs` finds it queued."""
    run = request.run_name or (declared_output_dir(request) or Path("run")).name
    command = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name or f'{JOB_NAME}:{run}'}",
        f"--nodes={args.nodes}",
        f"--gres=gpu:{args.gpus}",
        f"--time={args.time}",
        f"--signal=B:USR1@{args.signal_lead}",
        *sbatch_flags(slurm_resources(args)),
    ]
    if args.array:
        command.append(f"--array={args.array}")
    command += ["training.sh"]
    if request.method:
        command += ["--method", request.method]
    command += ["--config", request.recipe]
    if request.run_name:
        command += ["--run-name", request.run_name]
    if str(request.logs_dir) != "logs":
        command += ["--logs-dir", str(request.logs_dir)]
    if request.overrides:
        command += ["--", *request.overrides]
    return command


def node_loss_options(*prepared: Prepared) -> list[str]:
    """--no-kill for a job whose plans (a sweep's array: one per point) all have several vLLM
    servers: by default Slurm ends the whole job when one of its nodes fails; with several
    servers the run can go on without one (the others take its requests,
    launch/server_group.py). Not for one server: a failed node there ends the run anyway, and
    Slurm's own end-and-requeue of the job is what resumes it."""
    several = prepared and all(len(one.plan.servers) > 1 for one in prepared)
    return ["--no-kill"] if several else []


def uses_gpus(*prepared: Prepared) -> bool:
    """Whether a job's plans (a sweep's: one per point) train or serve on a GPU: a use_cpu
    recipe with a CPU server asks Slurm for none (--gres=none, which overrides training.sh's
    header), or it would wait for GPUs it never touches."""
    return any(
        one.plan.device == "gpu" or any(s.device == "gpu" for s in one.plan.servers)
        for one in prepared
    )


def fit_gpu_request(command: list[str], *prepared: Prepared) -> None:
    """The command's --gres=gpu:N becomes --gres=none when no plan uses a GPU (uses_gpus)."""
    if prepared and not uses_gpus(*prepared):
        command[:] = ["--gres=none" if f.startswith("--gres=") else f for f in command]


def submit_sbatch(request: RunRequest, args, command: list[str]) -> str:
    """Check, then queue; returns the job id. sbatch's own refusal is one line too. Adds the
    plan's node-loss options to `command` (node_loss_options), so the printed command has them."""
    require_slurm("sbatch")
    # full (check_for): a few seconds once on the login node, and a broken reward or column is
    # refused before the job waits in the queue, not when it starts.
    prepared, _ = check_for(request, planned_environment(args.nodes, args.gpus))
    command[1:1] = node_loss_options(prepared)
    fit_gpu_request(command, prepared)
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        reason = " ".join(result.stderr.split()) or f"exit code {result.returncode}"
        raise UserError(f"sbatch refused the job: {reason}")
    return result.stdout.strip().split(";")[0]
