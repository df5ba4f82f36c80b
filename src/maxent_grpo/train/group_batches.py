"""Batches of TRL's generation output made from whole groups of other batches: the rollout
rounds' (train/rollout_rounds.py: groups of several rounds) and replay's (train/replay.py:
groups of several steps). Importing this imports torch and transformers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import ProcessorMixin

# TRL pads prompts on the left (they end where the completion starts), the rest on the right.
_LEFT_PADDED = {"prompt_ids", "prompt_mask"}


def text_tokenizer(trainer):
    """The text tokenizer (a processor's, for a multimodal model)."""
    processing = trainer.processing_class
    return processing.tokenizer if isinstance(processing, ProcessorMixin) else processing


def merge_groups(groups: list[dict], pad_token_id: int) -> dict:
    """One batch from groups of different widths: each 2-D key padded to the widest (prompts
    on the left, completions on the right; pad tokens, masks 0, tool masks 1: a padded
    position is no tool output) and concatenated in order."""
    batch = {}
    for key in groups[0]:
        parts = [g[key] for g in groups]
        if parts[0].ndim == 2:
            width = max(p.size(1) for p in parts)
            fill = pad_token_id if key in ("prompt_ids", "completion_ids") else 0
            fill = 1 if key == "tool_mask" else fill
            parts = [
                F.pad(
                    p,
                    (width - p.size(1), 0) if key in _LEFT_PADDED else (0, width - p.size(1)),
                    value=fill,
                )
                for p in parts
            ]
        batch[key] = torch.cat(parts)
    return batch
