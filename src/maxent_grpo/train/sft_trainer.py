"""Our SFT trainer (`method: sft`): TRL's SFTTrainer with GRPO's checkpoint machinery.

Complete checkpoints (the marker, rotation of complete ones only, the state registry, the CPU
optimizer load) come from the CompleteCheckpoints component (train/components.py); stopping at
a step boundary on SIGTERM or the stop file, the heartbeat, step events and resume from the
last complete checkpoint come from train/entry.py's train(), as for GRPO. Importing this
module imports TRL (seconds).
"""

from __future__ import annotations

import trl

from maxent_grpo.train.trl_adapter import HookedTrainer


class SFTTrainer(HookedTrainer, trl.SFTTrainer):
    method = "sft"
