"""Our GRPO trainer: TRL's GRPOTrainer with an adaptive beta (kl_target, kl_horizon),
complete-checkpoint marking, rollout filters and carry-over (train/rollout_mixin.py), the
data order of an uninterrupted run on resume, vLLM weight sync and asynchronous generation
(train/async_generation.py) and a KL-adaptive entropy bonus (train/entropy_kl.py).
Importing this module imports TRL (seconds): the trainer process imports it once the recipe is
read (train_process.py `trainer_class`).
"""

from __future__ import annotations

import trl

from maxent_grpo.train.adaptive_kl import AdaptiveKLMixin
from maxent_grpo.train.async_generation import AsyncGenerationMixin
from maxent_grpo.train.checkpoints import CompleteCheckpointsMixin
from maxent_grpo.train.data_order import EpochOrderMixin
from maxent_grpo.train.entropy_kl import EntropyKLMixin
from maxent_grpo.train.rollout_mixin import RolloutMixin
from maxent_grpo.train.step_time import StepTimeMixin
from maxent_grpo.train.vllm_sync import VLLMSyncMixin


# AdaptiveKLMixin first: its checkpoint state loads on every path of the others.
# RolloutMixin after CompleteCheckpointsMixin: its state is written before the marker.
class GRPOTrainer(
    AdaptiveKLMixin,
    EntropyKLMixin,
    CompleteCheckpointsMixin,
    RolloutMixin,
    EpochOrderMixin,
    StepTimeMixin,
    AsyncGenerationMixin,
    VLLMSyncMixin,
    trl.GRPOTrainer,
):
    pass
