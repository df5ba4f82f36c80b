"""Training one recipe: train() builds the trainer and runs it (train_process.py is the main).

train() is deliberately thin: data, rewards, tokenizer, TRL trainer, resume from the last
complete checkpoint, final save, completion marker. Everything that can be checked before a
model is loaded is checked first (recipe.checks), so a bad recipe costs seconds, not a GPU
slot. The method (grpo | maxent | sft) picks the recipe sections (recipe/sections.py) and the
trainer class (train_process.py `trainer_class`).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import linecache
import logging
import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import NoReturn

from maxent_grpo.errors import (
    ConfigError,
    UserError,
    exception_text,
)
from maxent_grpo.faults import failpoint
from maxent_grpo.methods import RL_METHODS
from maxent_grpo.recipe.needs import uses_wandb
from maxent_grpo.rundir.checkpoints import (
    last_complete_checkpoint,
    mark_run_complete,
    run_is_complete,
)
from maxent_grpo.rundir.events import emit
from maxent_grpo.timers import timed
from maxent_grpo.train import rollout_func, trl_adapter
from maxent_grpo.train.checkpoints import make_stop_callback
from maxent_grpo.train.heartbeat import attach_heartbeat
from maxent_grpo.train.reference_model import reference_model
from maxent_grpo.train.startup import started
from maxent_grpo.train.wandb_run import export_wandb_run, make_wandb_step_callback


class StoppedForRequeue(Exception):
    """Training stopped at a step boundary on request, after saving a complete checkpoint."""


logger = logging.getLogger("maxent_grpo")


def _setup_logging(training_args) -> None:
    import datasets
    import transformers

    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        format=f"%(asctime)s %(levelname)s [rank{rank}] %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stdout,
    )
    level = training_args.get_process_log_level()
    # Our own messages (resume point, completion) always show on the main process.
    logger.setLevel(logging.INFO if training_args.should_log else logging.WARNING)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)


def _export_wandb_settings(training_args) -> None:
    for key, env in (
        ("wandb_entity", "WANDB_ENTITY"),
        ("wandb_project", "WANDB_PROJECT"),
        ("wandb_run_group", "WANDB_RUN_GROUP"),
    ):
        value = getattr(training_args, key)
        if value:
            os.environ[env] = value
    # One W&B run across attempts: the run id persisted in output_dir (train/wandb_run.py).
    export_wandb_run(training_args)


def load_tokenizer(model_args, training_args):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
    )
    if training_args.chat_template is not None:
        tokenizer.chat_template = training_args.chat_template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _model_init_kwargs(model_args, training_args) -> dict:
    kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    kwargs.update(training_args.model_init_kwargs or {})
    return kwargs


def _is_final(checkpoint: Path, training_args) -> bool:
    """Whether a checkpoint already holds the last training step of this recipe."""
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    max_steps = training_args.max_steps if training_args.max_steps > 0 else state["max_steps"]
    return state["global_step"] >= max_steps


def make_step_event_callback():
    """A TrainerCallback: a `step` event (rundir/events.py) for every log of the main process."""
    from transformers import TrainerCallback  # deferred: transformers is slow to import

    class StepEvents(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            metrics = {k: v for k, v in logs.items() if isinstance(v, (int, float)) and k != "step"}
            with timed("step_events"):
                emit(
                    args.output_dir,
                    "step",
                    step=state.global_step,
                    metrics=metrics,
                    max_steps=state.max_steps,
                )

    return StepEvents()


def _rewards_and_tools(recipe) -> dict:
    """GRPO's trainer arguments beyond the data: the reward functions, and tools if any, as
    check_recipe resolved them in this process (resolved here for a recipe it did not check)."""
    from maxent_grpo.preflight import check_rewards  # imports rewards/ (sympy): seconds
    from maxent_grpo.rewards import guard_rewards  # imports sympy (math rewards): seconds

    script_args = recipe.script
    resolved = recipe.resolved or check_rewards(script_args, recipe.training)
    reward_funcs = guard_rewards(resolved.reward_funcs, script_args.reward_timeout_seconds)
    # TRL's GRPOTrainer takes tools only when there are some (it checks the chat template).
    extra = {"reward_funcs": reward_funcs, **({"tools": resolved.tools} if resolved.tools else {})}
    extra.update(rollout_func.trainer_arguments(recipe.training))  # the recipe's own, if any
    if resolved.environment is not None:  # a class: TRL makes one instance per rollout
        extra["environment_factory"] = resolved.environment
    return extra


def _build_trainer(recipe, trainer_class):
    from trl import get_peft_config

    from maxent_grpo.data import load_datasets  # imports datasets: seconds

    script_args, training_args, model_args = recipe.script, recipe.training, recipe.model
    dataset = load_datasets(script_args)
    generates = recipe.method in RL_METHODS  # SFT: no rewards, no reference model
    if not generates:
        from maxent_grpo.data.sft_rows import prompt_completion  # imports datasets

        dataset = {split: prompt_completion(rows) for split, rows in dataset.items()}
    extra = _rewards_and_tools(recipe) if generates else {}
    tokenizer = load_tokenizer(model_args, training_args)
    training_args.model_init_kwargs = _model_init_kwargs(model_args, training_args)
    # A text model uses every trainable parameter in each step, so DDP's search for unused
    # ones (transformers turns it on when gradient checkpointing is off) only costs a graph
    # walk per step and prints a warning on each rank. A recipe may still set it.
    if training_args.ddp_find_unused_parameters is None:
        training_args.ddp_find_unused_parameters = False
    # load_datasets names the splits "train" and (when there is one) "test".
    eval_dataset = dataset.get("test") if training_args.eval_strategy != "no" else None
    reference = reference_model(training_args, model_args) if generates else nullcontext()
    with _refused_values(recipe), reference:
        return trainer_class(
            model=model_args.model_name_or_path,
            args=training_args,
            train_dataset=dataset["train"],
            eval_dataset=eval_dataset,
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args),
            **extra,
        )


# What a constructor's check raises for a value it refuses (TRL's GRPOTrainer.__init__,
# transformers' Trainer.__init__, a config's __post_init__, our components).
_REFUSALS = (ValueError, TypeError, AssertionError, NotImplementedError)
_CONSTRUCTORS = ("__init__", "__post_init__")


def raised_by_a_check(exc: BaseException) -> bool:
    """Whether `exc` comes from a constructor's own check: its innermost frame is an
    `__init__` / `__post_init__` stopped at a `raise` or `assert` statement. A library bug
    (a failing lookup or call, anywhere, or any error deeper down) is not."""
    tb = exc.__traceback__
    if not isinstance(exc, _REFUSALS) or tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    statement = linecache.getline(code.co_filename, tb.tb_lineno).lstrip()
    return code.co_name in _CONSTRUCTORS and statement.startswith(("raise ", "assert "))


@contextmanager
def _refused_values(recipe) -> Iterator[None]:
    """A value of the recipe that the trainer refuses while it is built is a user error: one
    line naming the recipe and, when the message names one, the key (recipe/checks.py refuses
    what it can earlier). Only a constructor's check counts (raised_by_a_check); anything else
    raised while the trainer is built is a crash, with its class and traceback in the log."""
    try:
        yield
    except UserError:
        raise
    except _REFUSALS as exc:
        if not raised_by_a_check(exc):
            raise
        logger.debug("the trainer refused the recipe", exc_info=True)
        raise ConfigError(refusal_line(recipe, exc)) from exc


def _named(key: str) -> str:
    """A key in a library's message: `reward_weights`, or in prose, "reward weights"."""
    return r"(?<![\w.])" + re.escape(key).replace("_", "[_ ]") + r"(?!\w)"


def refusal_line(recipe, exc: BaseException) -> str:
    """`recipe: key 'k' (value): the trainer refused it: message`, or without a key."""
    text = exception_text(exc)
    sections = [s for s in (recipe.script, recipe.training, recipe.model) if s is not None]
    named = [
        (match.start(), field.name, getattr(section, field.name))
        for section in sections
        for field in dataclasses.fields(section)
        if (match := re.search(_named(field.name), text, re.IGNORECASE))
    ]
    if not named:
        return f"{recipe.path}: the trainer refused the recipe: {text}"
    _, key, value = min(named)  # the first key the message names
    return f"{recipe.path}: key '{key}' ({value!r}): the trainer refused it: {text}; fix {key}"


def _train_from_last_checkpoint(trainer, output_dir: Path, training_args) -> float | None:
    """Train, resuming from the last complete checkpoint; the training loss (None: none run)."""
    checkpoint = None if failpoint("resume_restart") else last_complete_checkpoint(output_dir)
    if checkpoint is not None:
        logger.info("Resuming from %s", checkpoint)
    failpoint("train_start")
    if checkpoint is not None and _is_final(checkpoint, training_args):
        # Killed after the last step's checkpoint (e.g. during the final save). Resuming
        # there, HF Trainer would run one step too many: load it and only save again.
        from transformers import TrainerState

        trl_adapter.load_from_checkpoint(trainer, str(checkpoint))
        trainer.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
        return None
    resume = str(checkpoint) if checkpoint else None
    return trainer.train(resume_from_checkpoint=resume).training_loss


def _save_final(trainer, output_dir: Path, method: str, train_loss: float | None) -> None:
    trainer.save_model(str(output_dir))
    trainer.save_state()  # trainer_state.json (log history) beside the final model
    failpoint("final_save")
    trainer.accelerator.wait_for_everyone()
    if trainer.accelerator.is_main_process:
        mark_run_complete(
            output_dir,
            {"method": method, "global_step": trainer.state.global_step, "train_loss": train_loss},
        )
        logger.info("Training complete; model saved to %s", output_dir)


def train(recipe, trainer_class: type, callbacks: Sequence = ()) -> None:
    """Train one checked recipe to completion (or to the next checkpoint when stopped), with
    the method's trainer class and the caller's extra callbacks (evaluations)."""
    from transformers import set_seed  # deferred: transformers is slow to import

    training_args = recipe.training
    _setup_logging(training_args)
    output_dir = Path(training_args.output_dir)
    if run_is_complete(output_dir):
        logger.info("%s already holds a completed run; nothing to do.", output_dir)
        return
    set_seed(training_args.seed)
    _export_wandb_settings(training_args)
    trainer = _build_trainer(recipe, trainer_class)
    attach_heartbeat(trainer)  # the launcher's hang watchdog; stacks on request
    stop = make_stop_callback(trainer)  # also: SIGTERM saves at the next step boundary
    trainer.add_callback(stop)
    trainer.add_callback(make_step_event_callback())
    for callback in callbacks:
        trainer.add_callback(callback)
    if uses_wandb(training_args):
        trainer.add_callback(make_wandb_step_callback())
    started()  # start-up's one garbage collection (train/startup.py), then training's own
    train_loss = _train_from_last_checkpoint(trainer, output_dir, training_args)
    if stop.stopped and trainer.state.global_step < trainer.state.max_steps:
        trainer.accelerator.wait_for_everyone()  # no rank leaves while another still saves
        logger.info(
            "Stopped on request after step %d; saved %s",
            trainer.state.global_step,
            last_complete_checkpoint(output_dir),
        )
        raise StoppedForRequeue(trainer.state.global_step)
    _save_final(trainer, output_dir, recipe.method, train_loss)


def exit_process(code: int) -> NoReturn:
    """End a training process with `code` without tearing the interpreter down.

    atexit handlers still run (logging's flush, W&B's finish, a profiler's record); what is
    skipped is the teardown of torch, transformers and TRL: 1.1 s per process here, which the
    end of every attempt would wait for, a stopped attempt's requeue included. Everything
    this process writes is closed (checkpoints fsynced) before cli_main returns. Under a
    profiler or a debugger (cProfile writes its file after the script), the normal exit.
    """
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)
    atexit._run_exitfuncs()  # noqa: SLF001 - the one way to run them without the teardown
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # closed or broken: nothing more can be said on it
    os._exit(code)
