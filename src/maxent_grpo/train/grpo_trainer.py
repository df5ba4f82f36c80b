"""Our GRPO trainer: TRL's GRPOTrainer with the components a recipe turns on
(train/components.py: an adaptive beta, a KL-adaptive entropy bonus, complete checkpoints,
rollout filters and rounds, the data order of an uninterrupted run on resume, the step's time
split, vLLM weight sync and asynchronous generation), called from the one class of ours that
overrides TRL's hooks (train/trl_adapter.py `HookedTrainer`).
Importing this module imports TRL (seconds): the trainer process imports it once the recipe is
read (train_process.py `trainer_class`).
"""

from __future__ import annotations

import trl

from maxent_grpo.train.trl_adapter import HookedTrainer


class GRPOTrainer(HookedTrainer, trl.GRPOTrainer):
    method = "grpo"
