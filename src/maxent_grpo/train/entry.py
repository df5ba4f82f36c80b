"""The training entry point shared by `src/grpo.py` and `src/maxent-grpo.py`.

main() is deliberately thin: data, rewards, tokenizer, TRL trainer, resume from the last
complete checkpoint, final save, completion marker. Everything that can be checked before a
model is loaded is checked first (preflight), so a bad recipe costs seconds, not a GPU slot.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from pathlib import Path

from maxent_grpo.configs import world_size_from_env
from maxent_grpo.errors import EXIT_CHECKPOINTED, EXIT_USER_ERROR, UserError
from maxent_grpo.faults import failpoint
from maxent_grpo.train.checkpoints import (
    CompleteCheckpointsMixin,
    last_complete_checkpoint,
    make_stop_callback,
    mark_run_complete,
    run_is_complete,
)


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
    import json

    state = json.loads((checkpoint / "trainer_state.json").read_text())
    max_steps = training_args.max_steps if training_args.max_steps > 0 else state["max_steps"]
    return state["global_step"] >= max_steps


def grpo_trainer_class():
    """TRL's GRPOTrainer with complete-checkpoint marking and vLLM weight sync (nccl | disk).

    Imported lazily: TRL is slow.
    """
    import trl

    from maxent_grpo.train.vllm_sync import VLLMSyncMixin

    class GRPOTrainer(CompleteCheckpointsMixin, VLLMSyncMixin, trl.GRPOTrainer):
        pass

    return GRPOTrainer


def main(script_args, training_args, model_args, trainer_class=None, method: str = "grpo"):
    """Train one recipe to completion (or to the next checkpoint when stopped)."""
    from transformers import set_seed
    from trl import get_peft_config

    from maxent_grpo.data import load_datasets
    from maxent_grpo.rewards import get_reward_funcs, guard_rewards

    _setup_logging(training_args)
    output_dir = Path(training_args.output_dir)
    if run_is_complete(output_dir):
        logger.info("%s already holds a completed run; nothing to do.", output_dir)
        return
    set_seed(training_args.seed)
    _export_wandb_settings(training_args)

    dataset = load_datasets(script_args)
    reward_funcs = guard_rewards(
        get_reward_funcs(
            script_args.reward_funcs,
            **script_args.reward_settings(training_args.max_completion_length),
        ),
        script_args.reward_timeout_seconds,
    )
    tokenizer = load_tokenizer(model_args, training_args)
    training_args.model_init_kwargs = _model_init_kwargs(model_args, training_args)

    # load_datasets names the splits "train" and (when there is one) "test".
    eval_dataset = dataset.get("test") if training_args.eval_strategy != "no" else None

    trainer_class = trainer_class or grpo_trainer_class()
    trainer = trainer_class(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset["train"],
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )

    stop = make_stop_callback(trainer)
    trainer.add_callback(stop)
    checkpoint = last_complete_checkpoint(output_dir)
    if checkpoint is not None:
        logger.info("Resuming from %s", checkpoint)
    failpoint("train_start")
    if checkpoint is not None and _is_final(checkpoint, training_args):
        # Killed after the last step's checkpoint (e.g. during the final save). Resuming
        # there, HF Trainer would run one step too many: load it and only save again.
        from transformers import TrainerState

        trainer._load_from_checkpoint(str(checkpoint))
        trainer.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
        train_loss = None
    else:
        resume = str(checkpoint) if checkpoint else None
        train_loss = trainer.train(resume_from_checkpoint=resume).training_loss
    if stop.stopped and trainer.state.global_step < trainer.state.max_steps:
        trainer.accelerator.wait_for_everyone()  # no rank leaves while another still saves
        logger.info(
            "Stopped on request after step %d; saved %s",
            trainer.state.global_step,
            last_complete_checkpoint(output_dir),
        )
        raise StoppedForRequeue(trainer.state.global_step)

    trainer.save_model(str(output_dir))
    trainer.save_state()  # trainer_state.json (log history) beside the final model
    failpoint("final_save")
    trainer.accelerator.wait_for_everyone()
    if trainer.accelerator.is_main_process:
        mark_run_complete(
            output_dir,
            {
                "method": method,
                "global_step": trainer.state.global_step,
                "train_loss": train_loss,
            },
        )
        logger.info("Training complete; model saved to %s", output_dir)


def parse_and_check(argv: list[str], types=None):
    """Parse a recipe and run every check that needs no model: one line per problem."""
    from maxent_grpo.configs import GRPO_TYPES, parse_recipe
    from maxent_grpo.preflight import check_recipe

    parsed = parse_recipe(argv, types or GRPO_TYPES)
    script_args, training_args, model_args = parsed[:3]
    mixture = check_recipe(script_args, training_args, model_args)
    script_args = dataclasses.replace(script_args, dataset_mixture=mixture)
    return (script_args, training_args, model_args, *parsed[3:])


def cli_main(argv: list[str], types=None, trainer_class_factory=None, method: str = "grpo") -> int:
    """Entry point body: user errors are one line on stderr and exit code EXIT_USER_ERROR."""
    try:
        script_args, training_args, model_args, *_ = parse_and_check(argv, types)
        trainer_class = trainer_class_factory() if trainer_class_factory else None
        main(script_args, training_args, model_args, trainer_class, method)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except StoppedForRequeue:
        # One process: a distinct code. Under accelerate/torchrun a non-zero rank would make
        # torchrun kill its peers and print a failure report; the launcher knows it asked.
        return EXIT_CHECKPOINTED if world_size_from_env() == 1 else 0
    return 0
