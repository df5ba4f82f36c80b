"""Completions for a benchmark's prompts: vLLM's offline LLM when installed (GPU), else
transformers' `generate`.

Both take the prompts as chat-templated text (the tokenizer of the checkpoint, with the
recipe's chat_template when it sets one), so the model sees what it saw in training.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from maxent_grpo.benchmarks.spec import Benchmark


def pick_backend(requested: str, device: str) -> str:
    """auto: vLLM where it is installed and there is a GPU, else transformers."""
    if requested != "auto":
        return requested
    vllm = importlib.util.find_spec("vllm") is not None
    return "vllm" if vllm and device == "cuda" else "transformers"


def load_tokenizer(checkpoint: Path, base_model: str, chat_template: str | None):
    """The checkpoint's tokenizer (the trainer saves it there), else the recipe model's."""
    from transformers import AutoTokenizer

    source = checkpoint if (checkpoint / "tokenizer_config.json").is_file() else base_model
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def prompt_texts(tokenizer, prompts: Sequence[list[dict]]) -> list[str]:
    """Chat-templated prompts, ending where the assistant's turn starts."""
    if tokenizer.chat_template is None:
        return ["\n\n".join(m["content"] for m in messages) for messages in prompts]
    return [
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        for messages in prompts
    ]


class TransformersGenerator:
    """transformers' generate, batch by batch (left padding); `progress()` after each batch."""

    progress = None

    def __init__(self, checkpoint: Path, tokenizer, dtype: str | None, device: str):
        from transformers import AutoModelForCausalLM

        kwargs = {"dtype": dtype} if dtype not in (None, "auto") else {}
        self.model = AutoModelForCausalLM.from_pretrained(str(checkpoint), **kwargs).to(device)
        self.model.eval()
        self.tokenizer, self.device = tokenizer, device

    def _config(self, bench: Benchmark, max_new_tokens: int):
        from transformers import GenerationConfig

        sampling = {"temperature": bench.temperature, "top_p": bench.top_p, "top_k": 0}
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=not bench.greedy,
            num_return_sequences=bench.num_samples,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
            **({} if bench.greedy else sampling),
        )

    def generate(self, texts: list[str], bench: Benchmark, max_new_tokens: int) -> list[list[str]]:
        import torch

        torch.manual_seed(bench.seed)
        config, out = self._config(bench, max_new_tokens), []
        for start in range(0, len(texts), bench.batch_size):
            batch = texts[start : start + bench.batch_size]
            encoded = self.tokenizer(
                batch, return_tensors="pt", padding=True, add_special_tokens=False
            ).to(self.device)
            with torch.no_grad():
                ids = self.model.generate(**encoded, generation_config=config)
            new = ids[:, encoded["input_ids"].shape[1] :]
            decoded = self.tokenizer.batch_decode(new, skip_special_tokens=True)
            n = bench.num_samples
            out += [decoded[i * n : (i + 1) * n] for i in range(len(batch))]
            if self.progress is not None:
                self.progress()
        return out

    def close(self) -> None:
        self.model = None


class VLLMGenerator:
    """vLLM's offline engine on one GPU (one per evaluation, shared by its benchmarks), with
    the recipe's vLLM server settings: memory fraction and eager mode."""

    progress = None

    def __init__(self, checkpoint: Path, tokenizer, dtype: str | None, settings: dict[str, Any]):
        from vllm import LLM

        self.llm = LLM(
            model=str(checkpoint),
            tokenizer=tokenizer.name_or_path,
            dtype=dtype or "auto",
            gpu_memory_utilization=settings.get("gpu_memory_utilization", 0.9),
            enforce_eager=settings.get("enforce_eager", False),
            seed=settings.get("seed", 0),
        )

    def generate(self, texts: list[str], bench: Benchmark, max_new_tokens: int) -> list[list[str]]:
        from vllm import SamplingParams

        params = SamplingParams(
            n=bench.num_samples,
            temperature=bench.temperature,
            top_p=bench.top_p,
            max_tokens=max_new_tokens,
            seed=bench.seed,
        )
        results = self.llm.generate(texts, params, use_tqdm=False)
        return [[choice.text for choice in result.outputs] for result in results]

    def close(self) -> None:
        self.llm = None


def make_generator(
    backend: str, checkpoint: Path, tokenizer, dtype: str | None, device: str, settings: dict
):
    if backend == "vllm":
        return VLLMGenerator(checkpoint, tokenizer, dtype, settings)
    return TransformersGenerator(checkpoint, tokenizer, dtype, device)
