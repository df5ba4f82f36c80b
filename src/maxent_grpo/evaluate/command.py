"""`maxent-grpo eval --config R --checkpoint C`: one evaluation, by hand or as the evaluation
job (slurm/eval.sbatch runs it with --queued)."""

from __future__ import annotations

import os
import sys

from maxent_grpo.benchmarks.checks import check_benchmarks
from maxent_grpo.benchmarks.spec import select
from maxent_grpo.errors import EXIT_USER_ERROR, UserError, error_report
from maxent_grpo.evaluate.run import evaluate_target, quiet_progress, resolve_target
from maxent_grpo.evaluate.schedule import benchmarks_of
from maxent_grpo.recipe import build_recipe, read_recipe


def load_recipe(request):
    """The request's recipe, checked the way the trainer checks it (bf16 recipes are read as
    CPU recipes where there is no GPU), and its benchmark keys."""
    keys = read_recipe(request.argv(), request.method)
    if not _cuda():
        keys = keys.with_values(use_cpu=True)
    recipe = _build(keys, build_recipe)
    check_benchmarks(recipe.script, recipe.training)
    return recipe


def _build(keys, build_recipe):
    """The recipe built for the training job's number of processes (the trainer that queued
    this job says it, MAXENT_GRPO_WORLD_SIZE), else for 1, else for num_generations processes:
    an evaluation runs on one process, only the batch arithmetic depends on the number."""
    sizes = [int(os.environ.get("MAXENT_GRPO_WORLD_SIZE") or 0), 1, keys.num_generations]
    first = None
    for size in dict.fromkeys(s for s in sizes if s > 0):
        try:
            return build_recipe(keys, world_size=size)
        except UserError as exc:
            first = first or exc
    raise first


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _print(results: list[dict], failed: list[str], step: int) -> None:
    for fields in results:
        score = "-" if fields["score"] is None else f"{fields['score']:.4f}"
        print(
            f"{fields['benchmark']}: {fields['metric']} {score} at step {step} "
            f"({fields['problems']} problems x {fields['samples']} samples, "
            f"{fields['wall_s']:.1f}s); samples: {fields['samples_file']}",
            flush=True,
        )
    for name in failed:
        print(f"{name}: failed at step {step} (see the eval_fail event)", flush=True)


def main(request, checkpoint: str | None, step: int | None, names, queued: bool) -> int:
    """Evaluate; 0 when every benchmark was scored (or skipped), 1 when one failed, 2 for bad
    input (before any model loads)."""
    try:
        recipe = load_recipe(request)
        benches = select(benchmarks_of(recipe), list(names or []))
        if not benches:
            raise UserError(
                f"{recipe.path}: benchmarks: none set; add e.g. benchmarks: [arithmetic]"
            )
        target = resolve_target(recipe, checkpoint, step)
        if not queued and not target.available:
            raise UserError(
                f"--checkpoint {target.path}: not a complete checkpoint or saved model; "
                "give a checkpoint-N directory with its maxent_grpo_complete.json"
            )
    except UserError as exc:
        print(error_report(exc), file=sys.stderr)
        return EXIT_USER_ERROR
    os.environ.update(recipe.env)
    quiet_progress()
    job = os.environ.get("SLURM_JOB_ID") or None
    results, failed = evaluate_target(recipe, benches, target, job=job)
    _print(results, failed, target.step)
    return 1 if failed else 0
