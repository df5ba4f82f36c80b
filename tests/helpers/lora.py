"""How far a trained LoRA adapter moved the tiny model (the vLLM LoRA tests)."""

from __future__ import annotations

from pathlib import Path

TEXT = "What is the sum of 12 plus 30? <think> 12 plus 30 </think> <answer> 42 </answer>"


def max_logprob_change(base: Path, adapter: Path) -> float:
    """How far the adapter moved the model: max |log p| difference on a fixed text."""
    import torch
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = torch.tensor([AutoTokenizer.from_pretrained(base)(TEXT)["input_ids"]])
    with torch.no_grad():
        before = AutoModelForCausalLM.from_pretrained(base).eval()(ids).logits.log_softmax(-1)
        after = AutoPeftModelForCausalLM.from_pretrained(adapter).eval()(ids).logits
    return (after.log_softmax(-1) - before).abs().max().item()
