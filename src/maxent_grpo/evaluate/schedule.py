"""When and where checkpoints are evaluated: the trainer's side.

benchmark_mode slurm (the default under Slurm): after each complete checkpoint the trainer's
main process queues an evaluation job (slurm/eval.sbatch) for every due checkpoint that has
none yet, and one for the final model at the end. Training never waits for one: the job
depends on nothing of training's; `--dependency=singleton` (one job name per run) runs a run's
evaluations one at a time, in order, and a failed one does not cancel the next (`afterok`
would). benchmark_mode inline (the default elsewhere): the main process evaluates the due
checkpoints that are still there and the final model in-process, after the final save.

Every decision reads the event log first (rundir/ledger.py), so a requeued job queues no
evaluation twice; a failure here is an `eval_fail` event and a log line, never a training
failure.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from maxent_grpo.benchmarks.spec import parse_benchmarks
from maxent_grpo.evaluate.run import Target, evaluate_target, quiet_progress, skip, step_of
from maxent_grpo.rundir.events import emit, read_events
from maxent_grpo.rundir.heartbeat import Heartbeat
from maxent_grpo.rundir.ledger import due_steps, missing

logger = logging.getLogger("maxent_grpo.evaluate")
EVAL_SBATCH = Path(__file__).resolve().parents[3] / "slurm" / "eval.sbatch"
SBATCH_TIMEOUT_S = 60
# Variables of the training job's processes that must not reach an evaluation job.
_JOB_ONLY = (
    "CUDA_VISIBLE_DEVICES",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)
_JOB_ONLY_PREFIXES = ("SLURM_", "TORCHELASTIC_", "ACCELERATE_", "SBATCH_")


def resolve_mode(mode: str, environ: Mapping[str, str] = os.environ) -> str:
    """auto: slurm inside a Slurm job, inline elsewhere."""
    if mode != "auto":
        return mode
    return "slurm" if environ.get("SLURM_JOB_ID") else "inline"


def benchmarks_of(recipe):
    return parse_benchmarks(recipe.script.benchmarks, recipe.script.system_prompt)


def _final_step(output_dir: Path) -> int | None:
    return step_of(output_dir)


def submission_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment sbatch gets: the training job's own variables left out (the job gets its
    own), SLURM_CONF kept, the Python to run the evaluation with and the number of training
    processes the recipe was built for."""
    env = {
        k: v
        for k, v in environ.items()
        if k not in _JOB_ONLY and (not k.startswith(_JOB_ONLY_PREFIXES) or k == "SLURM_CONF")
    }
    env["MAXENT_GRPO_PYTHON"] = sys.executable
    env["MAXENT_GRPO_WORLD_SIZE"] = environ.get("WORLD_SIZE") or "1"  # the recipe's batch size
    return env


def sbatch_command(recipe, path: Path, step: int, names: list[str], environ) -> list[str]:
    """`sbatch ... slurm/eval.sbatch` for one checkpoint, sized by benchmark_gpus/cpus/time."""
    script, out = recipe.script, Path(recipe.output_dir).absolute()
    command = [
        "sbatch",
        "--parsable",
        f"--job-name=maxent-grpo-eval-{out.name}",
        "--dependency=singleton",
        f"--time={script.benchmark_time}",
        f"--cpus-per-task={script.benchmark_cpus}",
        f"--gres={f'gpu:{script.benchmark_gpus}' if script.benchmark_gpus else 'none'}",
        f"--output={out / 'eval' / 'slurm-%j.out'}",
    ]
    if partition := environ.get("SLURM_JOB_PARTITION"):
        command.append(f"--partition={partition}")
    command += [*(script.benchmark_sbatch_args or []), str(EVAL_SBATCH)]
    command += ["--method", recipe.method, "--config", str(Path(recipe.path).absolute())]
    command += ["--checkpoint", str(path), "--step", str(step), "--queued"]
    for name in names:
        command += ["--benchmark", name]
    return command + (["--", *recipe.overrides] if recipe.overrides else [])


def submit(recipe, path: Path, step: int, names: list[str], environ=os.environ) -> str | None:
    """Queue one evaluation job; its id, or None (an `eval_fail` event says why)."""
    out = Path(recipe.output_dir)
    (out / "eval").mkdir(parents=True, exist_ok=True)
    command = sbatch_command(recipe, path, step, names, environ)
    try:
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=SBATCH_TIMEOUT_S,
            env=submission_environ(environ),
        )
        reason = " ".join(result.stderr.split()) or f"sbatch exited with {result.returncode}"
        job = result.stdout.strip().split(";")[0] if result.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired) as exc:
        job, reason = None, f"{type(exc).__name__}: {exc}"
    if job:
        emit(out, "eval_submit", step=step, checkpoint=str(path), benchmarks=names, job=job)
        logger.info("evaluation of step %d queued: job %s", step, job)
        return job
    emit(
        out,
        "eval_fail",
        step=step,
        checkpoint=str(path),
        benchmarks=names,
        reason=f"not queued: {reason}",
        job=None,
    )
    logger.warning("evaluation of step %d not queued: %s", step, reason)
    return None


def targets(recipe, final: bool) -> list[tuple[Path, int]]:
    """(path, step) of the due checkpoints, and of the final model when `final` and asked for;
    the final model is left out when a checkpoint of the same step is due."""
    out = Path(recipe.output_dir)
    events = list(read_events(out))
    found = [(out / f"checkpoint-{s}", s) for s in due_steps(events, recipe.script.benchmark_every)]
    step = _final_step(out) if final and recipe.script.benchmark_at_end else None
    if step is not None and step not in {s for _, s in found}:
        found.append((out.absolute(), step))
    return found


def queue_due(recipe, final: bool = False, environ=os.environ) -> None:
    """Queue an evaluation job for every target that has no evaluation event yet."""
    names = [b.name for b in benchmarks_of(recipe)]
    out = Path(recipe.output_dir)
    for path, step in targets(recipe, final):
        target = Target(path.absolute(), step)
        todo = missing(read_events(out), step, names)
        if todo and not target.available:
            skip(out, target, todo, None)
        elif todo:
            submit(recipe, target.path, step, todo, environ)


def evaluate_inline(recipe) -> None:
    """Evaluate the due checkpoints and the final model in this process, after training."""
    benches = benchmarks_of(recipe)
    quiet_progress()
    for path, step in targets(recipe, final=True):
        evaluate_target(recipe, benches, Target(path.absolute(), step), progress=_beats(recipe))


def _beats(recipe):
    """The trainer's heartbeat (rundir/heartbeat.py), beaten while an inline evaluation
    generates: the launcher's hang watchdog sees it progressing."""
    try:
        heartbeat = Heartbeat(recipe.output_dir)
    except Exception:  # noqa: BLE001 - no heartbeat, no beats
        return None
    return lambda: heartbeat.beat("evaluate")


def is_main_process(environ: Mapping[str, str] = os.environ) -> bool:
    return int(environ.get("RANK") or 0) == 0


def after_training(recipe, environ=os.environ) -> None:
    """The end of a completed training run (main process): queue or run what is still due.
    Nothing raised here reaches training: it has finished and saved."""
    if not recipe.script.benchmarks or not is_main_process(environ):
        return
    try:
        if resolve_mode(recipe.script.benchmark_mode, environ) == "slurm":
            queue_due(recipe, final=True, environ=environ)
        else:
            evaluate_inline(recipe)
    except Exception as exc:  # noqa: BLE001 - evaluation never fails a finished training run
        logger.error("evaluation after training failed: %s: %s", type(exc).__name__, exc)
        emit(
            recipe.output_dir,
            "eval_fail",
            step=None,
            checkpoint=None,
            benchmarks=[],
            reason=" ".join(f"{type(exc).__name__}: {exc}".split())[:500],
            job=None,
        )


def make_callback(recipe, environ=os.environ):
    """A TrainerCallback queueing evaluation jobs (benchmark_mode slurm), or None: at the start
    of training (checkpoints whose job was never queued, e.g. killed in between) and after
    every save."""
    if (
        not recipe.script.benchmarks
        or resolve_mode(recipe.script.benchmark_mode, environ) != "slurm"
    ):
        return None
    from transformers import TrainerCallback

    def queue(state) -> None:
        if not state.is_world_process_zero:
            return
        try:
            queue_due(recipe, environ=environ)
        except Exception as exc:  # noqa: BLE001 - never a training failure
            logger.error("evaluation not queued: %s: %s", type(exc).__name__, exc)

    class QueueEvaluations(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            queue(state)

        def on_save(self, args, state, control, **kwargs):
            queue(state)

    return QueueEvaluations()


def sbatch_available() -> bool:
    return shutil.which("sbatch") is not None
