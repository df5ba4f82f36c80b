"""MaxEnt-GRPO: listwise maximum-entropy weights with a KL pull toward a reference model.

weights.py holds the math, controllers.py the adaptive beta and tau, config.py the recipe keys,
trainer.py the TRL GRPOTrainer subclass. README.md documents the method.
"""


def maxent_trainer_class():
    """The MaxEnt trainer class (imported lazily: TRL is slow to import)."""
    from maxent_grpo.maxent.trainer import MaxEntGRPOTrainer

    return MaxEntGRPOTrainer
