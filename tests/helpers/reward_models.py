"""A tiny reward model (a one-label Qwen2 sequence classifier) built locally, no network."""

from __future__ import annotations

from pathlib import Path


def tiny_classifier(folder: Path, tiny_model: Path, labels: int = 1) -> Path:
    """A random Qwen2 sequence classifier with the tiny model's tokenizer, saved locally."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForSequenceClassification

    from maxent_grpo.tiny_model import qwen2_config

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    config = qwen2_config(
        tokenizer,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=32,
        num_labels=labels,
    )
    torch.manual_seed(0)
    Qwen2ForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
