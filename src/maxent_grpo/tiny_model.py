"""A tiny Qwen2 model and tokenizer, made locally in seconds, for the smoke run and the tests.

Nothing is fetched from a hub. The model is randomly initialised but has the real Qwen2
architecture, so every code path (TRL, vLLM, checkpoints) runs as it would on a real model.
Two choices are forced by vLLM on CPU: head_dim >= 32 (its CPU attention rejects 16) and
untied embeddings (a weight reload comes out wrong with tied ones).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

# Bump when the recipe below changes, so a stale cached model is rebuilt.
TINY_MODEL_VERSION = 1
DEFAULT_TINY_MODEL_DIR = Path(".cache") / "models" / "tiny-qwen2"


def checked_tiny_model_dir(cwd: Path | None = None) -> Path:
    """Where `check` and `plan` find (or make) the tiny model of a recipe that names
    DEFAULT_TINY_MODEL_DIR: this folder's when it is there, else the project's .cache (the
    checkout this package runs from; an installed package: ~/.cache/maxent-grpo). A check
    writes nothing in the folder it is run from; the run makes the model where it starts."""
    here = (cwd or Path.cwd()) / DEFAULT_TINY_MODEL_DIR
    if (here / "config.json").is_file():
        return DEFAULT_TINY_MODEL_DIR
    project = Path(__file__).resolve().parents[2]
    if (project / "pyproject.toml").is_file():
        return project / DEFAULT_TINY_MODEL_DIR
    return Path.home() / ".cache" / "maxent-grpo" / "models" / "tiny-qwen2"


SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_VERSION_FILE = "maxent_grpo_tiny_model.json"


def _tokenizer_corpus() -> list[str]:
    """Text the BPE merges are learned from: the built-in task's vocabulary and the tags."""
    words = "What is the sum of plus minus times has apples buys gives away How many does have"
    tags = "<think>\n reasoning </think>\n<answer>\n 42 \n</answer> system user assistant"
    digits = " ".join(str(n) for n in range(200))
    return [words, tags, digits, "+ - * ( ) = ?"] * 20


def _build_tokenizer():
    from tokenizers import Tokenizer, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    # Learn merges with the very pre-tokenizer Qwen2Tokenizer installs on load, so token ids
    # survive a save/load round trip (transformers 5 rebuilds a qwen2 tokenizer's pipeline).
    template = Qwen2Tokenizer()
    tok = Tokenizer.from_str(template.backend_tokenizer.to_str())
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(), trainer)
    state = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    tokenizer = Qwen2Tokenizer(
        vocab=state["vocab"],
        merges=merges,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


#: The sizes of Qwen2.5-0.5B, as in its config.json. The benchmarks build a randomly
#: initialised model of this real architecture offline (bench/bench_sync.py, the GPU kit).
QWEN2_5_0_5B_SIZES = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


CONTEXT = 1024  # the tiny model's context in tokens (max_position_embeddings)


def qwen2_config(tokenizer, **sizes):
    """A Qwen2 config of the given sizes for this tokenizer, as vLLM's CPU build needs it:
    untied embeddings (a weight reload of tied ones comes out wrong) and head_dim >= 32."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=CONTEXT,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **sizes,
    )


def build_tiny_model(out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """Write a tiny Qwen2 model + tokenizer to out_dir (atomically) and return the path."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    out = Path(out_dir)
    tokenizer = _build_tokenizer()
    config = qwen2_config(
        tokenizer,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )

    # Write into a sibling temp dir and rename: a concurrent reader never sees half a model.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _VERSION_FILE).write_text(json.dumps({"version": TINY_MODEL_VERSION, "seed": seed}))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _lock(file, timeout: float) -> None:
    """Take an exclusive lock on file, waiting at most timeout seconds (a build takes ~2 s)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                message = f"{file.name}: held by another build for {timeout:.0f}s"
                raise TimeoutError(message) from None
            time.sleep(0.2)


def is_current(model_dir: str | os.PathLike, seed: int = 0) -> bool:
    marker = Path(model_dir) / _VERSION_FILE
    try:
        meta = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return meta == {"version": TINY_MODEL_VERSION, "seed": seed}


def ensure_tiny_model(out_dir: str | os.PathLike = DEFAULT_TINY_MODEL_DIR, seed: int = 0) -> Path:
    """Return the cached tiny model, building it first if it is missing or stale.

    Processes that start at once (parallel test workers, the ranks of a job) build it once:
    the first holds a lock beside the model while the others wait for it and find it current.
    """
    if is_current(out_dir, seed):
        return Path(out_dir)
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        _lock(lock, timeout=300.0)
        if is_current(out, seed):
            return out
        return build_tiny_model(out, seed)
