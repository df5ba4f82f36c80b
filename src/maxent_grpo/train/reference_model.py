"""`reference_model_name_or_path`: the KL reference is another model than the starting policy.

TRL 1.16's GRPOTrainer takes no reference model: with beta > 0 (and no PEFT) its `__init__`
loads one itself, `create_model_from_path(<the policy's path>, **model_init_kwargs)`, right
after loading the policy the same way (the model is passed as a path), then prepares it
(dropout off, fp32 head, fused log-prob head, DeepSpeed/FSDP). While `__init__` runs we swap
that module global, so that its second call loads the recipe's reference instead and every
step after it stays TRL's own (docs/architecture.md, the overrides table).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from maxent_grpo.recipe.checks import check_same_vocabulary


def _loads_a_reference(training_args, model_args) -> bool:
    return (
        training_args.reference_model_name_or_path is not None
        and training_args.beta != 0.0
        and not model_args.use_peft
    )


@contextmanager
def reference_model(training_args, model_args) -> Iterator[None]:
    """Around the trainer's construction: TRL loads recipe's reference model, not a copy of
    the policy (nothing changes when the recipe names none or loads no reference)."""
    if not _loads_a_reference(training_args, model_args):
        yield
        return
    from trl.trainer import grpo_trainer  # deferred: TRL is slow to import

    reference = training_args.reference_model_name_or_path
    revision = training_args.reference_model_revision
    # Hub references are compared here, before any model loads (check_recipe did local ones).
    check_same_vocabulary(
        model_args.model_name_or_path, model_args.model_revision, reference, revision
    )
    original = grpo_trainer.create_model_from_path
    calls = []

    def load(model_id, *args, **kwargs):
        calls.append(model_id)
        if len(calls) == 1:  # the policy: TRL loads it first
            return original(model_id, *args, **kwargs)
        return original(reference, *args, **{**kwargs, "revision": revision})

    grpo_trainer.create_model_from_path = load
    try:
        yield
    finally:
        grpo_trainer.create_model_from_path = original
