"""Our SFT trainer (`method: sft`): TRL's SFTTrainer with GRPO's checkpoint machinery.

Complete checkpoints (the marker, rotation of complete ones only, the state registry, the CPU
optimizer load) come from CompleteCheckpointsMixin; stopping at a step boundary on SIGTERM or
the stop file, the heartbeat, step events and resume from the last complete checkpoint come
from train/entry.py's train(), as for GRPO. Importing this module imports TRL (seconds).
"""

from __future__ import annotations

import trl

from maxent_grpo.train.checkpoints import CompleteCheckpointsMixin

ANSWER_COLUMN = "solution"  # data/load.py's name for the recipe's dataset_answer_column


class SFTTrainer(CompleteCheckpointsMixin, trl.SFTTrainer):
    pass


def prompt_completion(dataset):
    """The recipe's rows (data/load.py: `prompt` and the answer column) as TRL's
    prompt-completion rows: the answer is the assistant's reply (a chat prompt) or the text
    after the prompt (a prompt_template), and the loss is on it alone (TRL's
    completion_only_loss)."""
    if ANSWER_COLUMN not in dataset.column_names:
        return dataset

    def convert(row: dict) -> dict:
        answer = row[ANSWER_COLUMN]
        if isinstance(row["prompt"], str):
            return {"completion": answer}
        return {"completion": [{"role": "assistant", "content": answer}]}

    return dataset.map(convert, remove_columns=[ANSWER_COLUMN])
