"""maxent-grpo: recipes and launchers for GRPO and MaxEnt-GRPO post-training on Slurm."""

__version__ = "0.1.0"
