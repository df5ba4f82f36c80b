"""The GPU kit's model: Qwen2.5-0.5B's architecture with random weights, built offline.

Its tokenizer is the tiny model's (tiny_model._build_tokenizer), padded to the model's
151,936 ids with made-up tokens of 2-3 random bytes. Without them, 99.8 % of what the random
model samples were ids the tokenizer does not have, which decode to nothing: on the H200 every
completion was (nearly) empty text, every reward 0 and GRPO's grad_norm 0 at every step. With
them, a completion is random bytes, as a random model's text is, and the rewards spread. The
prompts encode to the same ids as with the tiny tokenizer (no merge reaches a made-up token).
"""

from __future__ import annotations

import json
import random
from pathlib import Path


def padded_tokenizer(size: int, seed: int = 0):
    """The tiny tokenizer with made-up byte-level tokens appended up to `size` ids."""
    from tokenizers import pre_tokenizers
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    from maxent_grpo.tiny_model import _build_tokenizer  # the offline tokenizer recipe

    tiny = _build_tokenizer()
    state = json.loads(tiny.backend_tokenizer.to_str())["model"]
    vocab = dict(state["vocab"])
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # one character per byte
    rng = random.Random(seed)
    while len(vocab) < size:
        token = "".join(rng.choices(alphabet, k=rng.choice((2, 3))))
        vocab.setdefault(token, len(vocab))
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        eos_token=tiny.eos_token,
        pad_token=tiny.pad_token,
        unk_token=None,
    )
    tokenizer.chat_template = tiny.chat_template
    return tokenizer


def build_qwen_shape(out: Path, device: str = "cuda", sizes: dict | None = None) -> None:
    """Random weights in bf16 of Qwen2.5-0.5B's sizes (or `sizes`), and the padded tokenizer."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from maxent_grpo.tiny_model import QWEN2_5_0_5B_SIZES

    sizes = sizes or QWEN2_5_0_5B_SIZES
    tokenizer = padded_tokenizer(sizes["vocab_size"])
    config = Qwen2Config(
        **sizes,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
