"""Before an attempt: a run request, read, checked and planned without importing torch or TRL.

`prepare` is what training.sh (local or under sbatch), the submitit launcher, `maxent-grpo
run`, `check`, `plan` and `sbatch` all do first; launch/attempt.py then runs the plan.
Decisions live in recipe/ (keys, checks), methods.py and plan/.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.errors import UserError
from maxent_grpo.launch.local_data import check_local_data, check_reward_names
from maxent_grpo.launch.overrides import EnvOverrides, env_overrides
from maxent_grpo.launch.plan import Environment, Plan, Ports, make_plan, parse_visible_devices
from maxent_grpo.launch.processes import free_port, slurm_nodes
from maxent_grpo.launch.requirements import check_installed
from maxent_grpo.preflight import check_recipe
from maxent_grpo.recipe import RecipeKeys, build_recipe, read_recipe
from maxent_grpo.recipe.checks import check_keys
from maxent_grpo.recipe.problems import collecting, rule
from maxent_grpo.timers import timed
from maxent_grpo.tiny_model import (
    DEFAULT_TINY_MODEL_DIR,
    checked_tiny_model_dir,
    ensure_tiny_model,
)


@dataclass(frozen=True)
class RunRequest:
    """What the command line asks for: a recipe, a method, a run name, recipe overrides."""

    recipe: str
    method: str | None = None  # None: the recipe's `method:` key, else grpo
    run_name: str | None = None
    overrides: tuple[str, ...] = ()
    logs_dir: Path = Path("logs")
    # a later start of a run may change keys that change training (launch/resume.py)
    accept_changes: bool = False

    def argv(self, env_flags: tuple[str, ...] = ()) -> list[str]:
        """The recipe's argv: --config, flags from the environment (launch/overrides.py), the
        run name's output_dir/run_name, the command line's overrides (the last one wins)."""
        named = ()
        if self.run_name:
            output_dir = str(Path("outputs") / self.run_name)
            named = ("--output_dir", output_dir, "--run_name", self.run_name)
        return ["--config", self.recipe, *env_flags, *named, *self.overrides]


@dataclass(frozen=True)
class Prepared:
    """A recipe's checked keys and the plan that runs it."""

    keys: RecipeKeys  # typed sections are built in the trainers (TRL is slow to import)
    plan: Plan
    notes: tuple[str, ...] = ()  # which environment variable overrode which key

    def describe(self) -> str:
        """The plan as `maxent-grpo plan` and the launcher print it."""
        overridden = [f"environment override: {note}" for note in self.notes]
        return "\n".join([*overridden, self.plan.describe()])


def environment_from_os(environ=os.environ) -> Environment:
    """What this job was given, read from CUDA_VISIBLE_DEVICES and Slurm's variables."""
    gpus = parse_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"))
    nodes = (
        tuple(environ.get("MAXENT_GRPO_NODES", "").split())
        or slurm_nodes(environ)
        or ("localhost",)
    )
    return Environment(gpus=gpus, nodes=nodes, python=sys.executable, cpus=allocated_cpus(environ))


def allocated_cpus(environ=os.environ) -> int:
    """CPUs this node gives the job: the CPUs this process may run on, capped by Slurm's
    count (--cpus-per-task, else the node's share) where Slurm does not bind CPUs itself."""
    usable = len(os.sched_getaffinity(0))
    for variable in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        value = environ.get(variable, "")
        if value.isdigit() and int(value) > 0:
            return min(usable, int(value))
    return usable


def prepare(
    request: RunRequest,
    environ=os.environ,
    environment: Environment | None = None,
    packages: bool = True,
    full: bool = False,
) -> Prepared:
    """Everything before a process starts: parse, make the tiny model if asked, plan, check.

    Imports no torch, TRL, transformers or datasets (seconds per attempt): the keys come from
    the committed schema, and only the checks the values decide run here (recipe/checks.py
    check_keys). The typed sections, with TRL's own checks, rewards and data columns, are
    built and checked once, in the trainers.

    full: `maxent-grpo check`: build and check the typed recipe as the trainers will, for the
    plan's processes (a superset of check_keys; imports TRL: seconds); unless the keys already
    have a problem (check's outer `collecting`): then check_keys, and no TRL import.

    environment: the allocation to plan for (default: this machine's, from environ).
    packages: check that this environment has the packages the recipe needs (vLLM, DeepSpeed,
    PEFT; launch/requirements.py); `maxent-grpo plan` only describes and skips it.
    Raises UserError (one line) for anything wrong with the recipe or the allocation.
    """
    # Each phase's time goes to a timer (maxent_grpo/timers.py; bench/launcher_phases.py).
    overrides = env_overrides(environ)
    with timed("prepare: read_recipe"):
        keys = read_recipe(request.argv(overrides.flags), _method(request, overrides))
    if packages:
        # under `maxent-grpo check`, reported with the recipe's problems
        with timed("prepare: check_installed"), rule(keys.path):
            check_installed(keys.path, keys.values)
    if keys.model_name_or_path and Path(keys.model_name_or_path) == DEFAULT_TINY_MODEL_DIR:
        tiny = DEFAULT_TINY_MODEL_DIR
        if full or not packages:  # check, plan: nothing is written where they are run
            tiny = checked_tiny_model_dir()
            keys = keys.with_values(model_name_or_path=str(tiny))
        with timed("prepare: ensure_tiny_model"):
            ensure_tiny_model(tiny)
    with timed("prepare: free ports"):
        vllm_port = overrides.vllm_port or free_port()
        ports = Ports(vllm_port, free_port(), free_port(), reward_model=free_port())
    with timed("prepare: environment"):
        environment = environment or environment_from_os(environ)
    if keys.use_cpu:
        # use_cpu: true trains on CPU even where GPUs are visible (e.g. Slurm's fake GPUs).
        environment = dataclasses.replace(environment, gpus=())
    with timed("prepare: make_plan"):
        plan = make_plan(environment, keys, ports)
    with timed("prepare: checks"), collecting(keys.path) as problems:
        # A recipe with problems already (the schema's, a missing package: check's outer
        # collecting holds them) gets the cheap checks, not the build: no TRL import (seconds).
        # So does one without output_dir, which the build would fill with TRL's default and
        # the launcher refuses (check_keys).
        if full and not problems.lines and keys.output_dir:  # notes: what scores the rollouts
            keys = dataclasses.replace(keys, notes=_build_and_check(keys, plan))
        else:  # every problem in one pass, as `check` reports them
            check_keys(keys, plan.train.num_processes)
            _check_data_and_rewards(keys)
    return Prepared(keys=keys, plan=plan, notes=overrides.notes)


def _check_data_and_rewards(keys: RecipeKeys) -> None:
    """What `check` finds in the data and rewards, told before launch rather than by every
    trainer: local files and their columns (read from their heads), reward names."""
    with collecting(keys.path) as problems:
        with problems.check("dataset_name", "dataset_mixture", "dataset_prompt_column"):
            check_local_data(keys.values)
        with problems.check("reward_funcs"):
            check_reward_names(keys.values.get("reward_funcs"))


def _build_and_check(keys: RecipeKeys, plan: Plan) -> tuple[str, ...]:
    """Every check of the trainers (TRL's, rewards, data columns, benchmarks) for the plan;
    returns the keys' notes with those of the checks."""
    if plan.device == "cpu" or not _cuda_here():
        # A GPU recipe is checked on a login node too: build it as if on CPU (bf16 etc.).
        keys = keys.with_values(use_cpu=True)
    return check_recipe(build_recipe(keys, world_size=plan.train.num_processes)).notes


def _method(request: RunRequest, overrides: EnvOverrides) -> str | None:
    """--method (or MAXENT=1) and TRAIN_ENTRYPOINT must agree when both are given."""
    asked, from_env = request.method, overrides.method
    if asked and from_env and asked != from_env:
        raise UserError(
            f"--method {asked} but TRAIN_ENTRYPOINT selects {from_env}; drop one of them"
        )
    return asked or from_env


def _cuda_here() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False
