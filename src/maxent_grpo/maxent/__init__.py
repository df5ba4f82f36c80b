"""MaxEnt-GRPO: listwise maximum-entropy weights with a KL pull toward a reference model.

weights.py holds the math, controllers.py the adaptive tau, config.py the recipe keys,
trainer.py the TRL GRPOTrainer subclass. README.md documents the method.
"""
