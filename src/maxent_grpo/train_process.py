"""The training process's main: `src/grpo.py`, `src/maxent-grpo.py`, `python -m maxent_grpo.train`.

On top of the layers (docs/architecture.md): it chooses the method's trainer class (train/ or
maxent/) and runs the recipe's evaluations after training (evaluate/), which train/ itself
may not import.
"""

from __future__ import annotations

import os
import sys

from maxent_grpo.errors import EXIT_CHECKPOINTED, EXIT_USER_ERROR, UserError, error_report
from maxent_grpo.evaluate.schedule import after_training, make_callback
from maxent_grpo.launch.processes import stop_with_parent
from maxent_grpo.methods import METHODS, RL_METHODS
from maxent_grpo.preflight import check_recipe
from maxent_grpo.recipe import build_recipe, read_recipe
from maxent_grpo.recipe.needs import import_error_line
from maxent_grpo.recipe.parser import RecipeKeys, take_flag
from maxent_grpo.train.entry import StoppedForRequeue, train
from maxent_grpo.train.startup import starting_up
from maxent_grpo.train.unused_libraries import mark_unused_libraries_absent


def trainer_class(method: str) -> type:
    """The trainer class of a method."""
    # Each imports TRL, which must wait for mark_unused_libraries_absent (cli_main).
    if method == "sft":
        from maxent_grpo.train.sft_trainer import SFTTrainer  # imports TRL

        return SFTTrainer
    if method == "maxent":
        from maxent_grpo.maxent.trainer import MaxEntGRPOTrainer  # imports TRL

        return MaxEntGRPOTrainer
    from maxent_grpo.train.grpo_trainer import GRPOTrainer  # imports TRL

    return GRPOTrainer


def world_size_from(environ) -> int:
    """Training processes of this job, as accelerate/torchrun announced them (1 when alone)."""
    return int(environ.get("WORLD_SIZE") or 1)


def on_cpu_without_cuda(keys: RecipeKeys, world_size: int) -> RecipeKeys:
    """use_cpu: true for several processes on a machine without CUDA: without it transformers
    does not train them as one job (each trains alone and all write the same checkpoints)."""
    if world_size == 1 or keys.values["use_cpu"]:
        return keys
    import torch

    return keys if torch.cuda.is_available() else keys.with_values(use_cpu=True)


def cli_main(argv: list[str], method: str | None = None) -> int:
    """Entry point body: user errors are one line on stderr and exit code EXIT_USER_ERROR.

    method: the entry script's (src/grpo.py: grpo), `--method`, or None for the recipe's.
    """
    stop_with_parent()  # under the launcher: SIGTERM (save, exit) when accelerate dies
    world_size = world_size_from(os.environ)
    keys = None
    try:
        with starting_up():  # garbage collector held until train() starts training
            keys = on_cpu_without_cuda(read_recipe(argv, method), world_size)  # no TRL yet
            mark_unused_libraries_absent(keys)
            recipe = build_recipe(keys, world_size)
            # This process starts the run's work: the recipe's env: block applies from here
            # on (under the launcher it is already in the environment, with the same values).
            os.environ.update(recipe.env)
            recipe = check_recipe(recipe)
            # Benchmarks score generations with the recipe's rewards: GRPO's keys (not SFT's).
            rl = recipe.method in RL_METHODS
            evaluations = make_callback(recipe) if rl else None  # slurm: a job per checkpoint
            callbacks = [c for c in (evaluations,) if c is not None]
            train(recipe, trainer_class(recipe.method), callbacks)
            if rl:
                after_training(recipe)  # benchmarks: queue (slurm) or run (inline) what is due
    except UserError as exc:
        print(error_report(exc), file=sys.stderr)
        return EXIT_USER_ERROR
    except ImportError as exc:  # a package the recipe asks for (flash-attn): the user's to fix
        path, values = (keys.path, keys.values) if keys else ("the recipe", {})
        print(f"error: {import_error_line(path, values, exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except StoppedForRequeue:
        # One process: a distinct code. Under accelerate/torchrun a non-zero rank would make
        # torchrun kill its peers and print a failure report; the launcher knows it asked.
        return EXIT_CHECKPOINTED if world_size == 1 else 0
    return 0


def main(argv: list[str]) -> int:
    """`python -m maxent_grpo.train [--method M] ...`: the method flag, then cli_main."""
    try:
        method, rest = take_flag(argv, "--method", "one of " + ", ".join(METHODS))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    return cli_main(rest, method)  # an unknown method is a one-line error there
