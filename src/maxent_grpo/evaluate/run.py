"""One evaluation: a recipe's benchmarks on one checkpoint (or the final model), scored into the
run's event log. `maxent-grpo eval`, the evaluation job (slurm/eval.sbatch) and the inline
evaluation at the end of training all come here.

Before any model loads: the benchmarks are checked, the benchmarks already scored at this
step are left out (a requeued or repeated evaluation scores nothing twice), and a checkpoint
that is gone (save_total_limit removed it) is reported as skipped, not as an error.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maxent_grpo.benchmarks.spec import Benchmark
from maxent_grpo.errors import UserError
from maxent_grpo.evaluate.generate import (
    load_tokenizer,
    make_generator,
    pick_backend,
    prompt_texts,
)
from maxent_grpo.evaluate.scoring import score_rewards
from maxent_grpo.faults import failpoint
from maxent_grpo.recipe.needs import uses_wandb
from maxent_grpo.rundir.checkpoints import CHECKPOINT_MARKER
from maxent_grpo.rundir.events import emit, read_events
from maxent_grpo.rundir.ledger import missing

logger = logging.getLogger("maxent_grpo.evaluate")
SAMPLES_DIR = "eval"  # <output_dir>/eval/<benchmark>/step-<N>.jsonl: every completion, scored
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class Target:
    """What to evaluate: a checkpoint directory (or the final model's) and its step."""

    path: Path
    step: int

    @property
    def available(self) -> bool:
        """A complete checkpoint, or a saved final model."""
        if _CHECKPOINT_RE.match(self.path.name):
            return (self.path / CHECKPOINT_MARKER).is_file()
        return (self.path / "config.json").is_file()


def step_of(path: Path) -> int | None:
    """A checkpoint's step: from its name (checkpoint-N), else its trainer_state.json."""
    if match := _CHECKPOINT_RE.match(path.name):
        return int(match.group(1))
    try:
        return int(json.loads((path / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def quiet_progress() -> None:
    """No progress bars (loading weights, mapping rows) in an evaluation's output."""
    import datasets
    from transformers.utils import logging as transformers_logging

    datasets.disable_progress_bars()
    transformers_logging.disable_progress_bar()


def _device(recipe) -> str:
    import torch

    return "cuda" if torch.cuda.is_available() and not recipe.training.use_cpu else "cpu"


def _reward(recipe, bench: Benchmark):
    from maxent_grpo.rewards import get_reward_funcs, guard_rewards  # imports sympy

    script = recipe.script
    settings = script.reward_settings(recipe.training.max_completion_length)
    funcs = get_reward_funcs([bench.reward], **settings)
    return guard_rewards(funcs, script.reward_timeout_seconds)[0]


def score_completions(reward, rows, completions: list[list[str]], bench: Benchmark):
    """(Score, rewards per problem): every completion scored with the dataset's columns, the
    way TRL calls a reward (one entry per completion; `solution` is the reference)."""
    flat = [c for samples in completions for c in samples]
    columns: dict[str, list[Any]] = {}
    for name in rows.column_names:
        values = rows[name]
        columns[name] = [values[i] for i, samples in enumerate(completions) for _ in samples]
    columns["prompts"] = columns.pop("prompt")
    scores = list(reward(flat, **columns)) if flat else []
    per_problem, start = [], 0
    for samples in completions:
        per_problem.append(scores[start : start + len(samples)])
        start += len(samples)
    return score_rewards(per_problem, bench.k, bench.pass_threshold), per_problem


def _write_samples(out: Path, bench: Benchmark, step: int, rows, completions, rewards) -> Path:
    path = out / SAMPLES_DIR / bench.name / f"step-{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as handle:
        for i, (samples, scores) in enumerate(zip(completions, rewards, strict=True)):
            line = {"prompt": rows[i]["prompt"][-1]["content"], "completions": samples}
            line.update({"rewards": scores, "solution": rows[i].get("solution")})
            handle.write(json.dumps(line) + "\n")
    os.replace(tmp, path)
    return path


def run_benchmark(recipe, bench: Benchmark, generator, tokenizer, target: Target) -> dict:
    """Generate, score and record one benchmark; returns its `eval` event's fields."""
    from maxent_grpo.benchmarks.data import load_rows  # imports datasets: seconds

    started = time.monotonic()
    rows = load_rows(bench, recipe.script, f"benchmarks ({bench.name})")
    max_new = bench.max_new_tokens or recipe.training.max_completion_length
    completions = generator.generate(prompt_texts(tokenizer, rows["prompt"]), bench, max_new)
    score, rewards = score_completions(_reward(recipe, bench), rows, completions, bench)
    samples = _write_samples(
        Path(recipe.output_dir), bench, target.step, rows, completions, rewards
    )
    return {
        "step": target.step,
        "benchmark": bench.name,
        "score": score.score,
        "metric": bench.metric,
        "problems": score.problems,
        "unscored": score.unscored,
        "samples": bench.num_samples,
        "k": bench.k,
        "mean_reward": score.mean_reward,
        "wall_s": round(time.monotonic() - started, 3),
        "checkpoint": str(target.path),
        "samples_file": str(samples),
    }


def skip(out: Path, target: Target, names: list[str], job: str | None) -> None:
    reason = f"{target.path} is gone (removed by save_total_limit?) before its evaluation started"
    if not _CHECKPOINT_RE.match(target.path.name):
        reason = f"{target.path} holds no saved model"
    _record(out, "eval_skip", target, names, job, reason)
    logger.warning("evaluation of step %d skipped: %s", target.step, reason)


def _record(out: Path, kind: str, target: Target, names: list[str], job, reason: str) -> None:
    """An eval_skip / eval_fail event for the benchmarks of one checkpoint."""
    emit(
        out,
        kind,
        step=target.step,
        checkpoint=str(target.path),
        benchmarks=names,
        reason=reason,
        job=job,
    )


def _open(recipe, target: Target, progress):
    """(generator, tokenizer, backend) for the target: its weights loaded once for every
    benchmark of the evaluation."""
    device = _device(recipe)
    backend = pick_backend(recipe.script.benchmark_backend, device)
    model, launch = recipe.model, recipe.launch
    tokenizer = load_tokenizer(target.path, model.model_name_or_path, recipe.training.chat_template)
    settings = {
        "gpu_memory_utilization": launch.vllm_server_gpu_memory_utilization,
        "enforce_eager": launch.vllm_server_enforce_eager,
    }
    generator = make_generator(backend, target.path, tokenizer, model.dtype, device, settings)
    generator.progress = progress
    return generator, tokenizer, backend


def _fail(out: Path, target: Target, names: list[str], job: str | None, exc: Exception) -> None:
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
    _record(out, "eval_fail", target, names, job, reason)
    logger.error("evaluation of %s at step %d failed: %s", ", ".join(names), target.step, reason)


def evaluate_target(
    recipe, benches: list[Benchmark], target: Target, job: str | None = None, progress=None
):
    """Score every benchmark not yet scored at the target's step; returns the `eval` fields
    written and the names that failed. A failure is an `eval_fail` event (one benchmark's
    failure does not stop the others); a checkpoint removed meanwhile is an `eval_skip`.
    progress(): called between generation batches."""
    failpoint("evaluation", target.step)
    out = Path(recipe.output_dir)
    todo = missing(read_events(out), target.step, [b.name for b in benches], ("eval",))
    if not todo:
        logger.info("step %d: every benchmark is scored already", target.step)
        return [], []
    try:
        if not target.available:
            raise FileNotFoundError(target.path)
        generator, tokenizer, backend = _open(recipe, target, progress)
    except Exception as exc:  # noqa: BLE001 - recorded: skipped (gone) or failed
        if not target.available:
            skip(out, target, todo, job)
            return [], []
        _fail(out, target, todo, job, exc)
        return [], todo
    results, failed = [], []
    try:
        for bench in (b for b in benches if b.name in todo):
            try:
                fields = run_benchmark(recipe, bench, generator, tokenizer, target)
            except Exception as exc:  # noqa: BLE001 - one benchmark's failure is recorded
                if not target.available:
                    skip(out, target, [bench.name], job)
                else:
                    _fail(out, target, [bench.name], job, exc)
                    failed.append(bench.name)
                continue
            emit(out, "eval", **fields, backend=backend, job=job)
            results.append(fields)
    finally:
        generator.close()
    report_wandb(recipe, results)
    return results, failed


def report_wandb(recipe, results: list[dict]) -> None:
    """Scores to W&B when the recipe reports there: the active run (inline evaluation in the
    trainer), else a run of its own in the training run's group (job_type eval; the training
    run's id, WANDB_RUN_ID, is not resumed: the training job may still be writing to it)."""
    if not results or not uses_wandb(recipe.training):
        return
    try:
        import wandb

        run, own = wandb.run, wandb.run is None
        if own:
            for variable in ("WANDB_RUN_ID", "WANDB_RESUME"):
                os.environ.pop(variable, None)
            name = Path(recipe.output_dir).name
            run = wandb.init(
                project=recipe.training.wandb_project,
                entity=recipe.training.wandb_entity,
                group=recipe.training.wandb_run_group or name,
                name=f"{name}-eval-step{results[0]['step']}",
                job_type="eval",
                mode=os.environ.get("WANDB_MODE") or None,  # online unless told otherwise
                dir=os.environ.get("WANDB_DIR") or str(Path(recipe.output_dir).absolute()),
            )
        rows: dict[int, dict] = {}  # one row per step: its benchmarks' scores
        for fields in results:
            row = rows.setdefault(fields["step"], {"train/global_step": fields["step"]})
            row[f"eval/{fields['benchmark']}"] = fields["score"]
        for row in rows.values():
            run.log(row)
        if own:
            run.finish()
    except Exception as exc:  # noqa: BLE001 - the scores are in the event log regardless
        logger.warning("W&B: scores not logged (%s: %s)", type(exc).__name__, exc)


def resolve_target(recipe, checkpoint: str | None, step: int | None) -> Target:
    """The checkpoint asked for (default: the run's final model) and its step."""
    path = Path(checkpoint) if checkpoint else Path(recipe.output_dir)
    found = step if step is not None else step_of(path)
    if found is None:
        raise UserError(
            f"--checkpoint {path}: no step (neither checkpoint-N nor a trainer_state.json); "
            "give --step N"
        )
    return Target(path.absolute(), found)
