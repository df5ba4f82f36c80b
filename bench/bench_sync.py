"""Weight-sync cost per step on the trainer's side: the full model (disk sync) against the LoRA
adapter (lora sync), without a server.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_sync.py [--repeats 3] [--shape tiny|qwen0.5b]

What one sync does on rank 0 before the server reads the files: `disk` writes every parameter
as safetensors (train/vllm_sync.py _SafetensorsWriter, the code the trainer runs), `lora`
saves the adapter (PEFT's save_pretrained, as LoRASyncVLLMGeneration does). Models: the tiny
Qwen2 of the tests, or a randomly initialised model of Qwen2.5-0.5B's shape (bf16, about 1 GB;
no download). The adapter: rank 16 on every linear layer of the blocks. Figures: bytes and
median seconds per sync of each; the server's load (reload_weights against load_lora_adapter)
comes on top and is measured by tests/vllm_server/. Writes bench/results/sync-<shape>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def build_model(shape: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from maxent_grpo.tiny_model import (
        DEFAULT_TINY_MODEL_DIR,
        QWEN2_5_0_5B_SIZES,
        ensure_tiny_model,
    )

    if shape == "tiny":
        path = ensure_tiny_model(Path(__file__).resolve().parents[1] / DEFAULT_TINY_MODEL_DIR)
        return AutoModelForCausalLM.from_pretrained(path)
    config = AutoConfig.for_model("qwen2", **QWEN2_5_0_5B_SIZES)
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def timed_runs(repeats: int, sync) -> tuple[float, int]:
    times, sizes = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(dir=RESULTS) as tmp:
            start = time.perf_counter()
            directory = sync(Path(tmp) / "sync")
            times.append(time.perf_counter() - start)
            sizes.append(sum(f.stat().st_size for f in directory.iterdir()))
    return statistics.median(times), sizes[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shape", choices=["tiny", "qwen0.5b"], default="tiny")
    args = parser.parse_args()
    from peft import LoraConfig, get_peft_model

    from maxent_grpo.train.vllm_sync import _SafetensorsWriter

    RESULTS.mkdir(exist_ok=True)
    model = build_model(args.shape)

    def full(directory: Path) -> Path:
        writer = _SafetensorsWriter(directory)
        for name, tensor in model.named_parameters():
            writer.add(name, tensor)
        writer.close()
        return directory

    full_s, full_bytes = timed_runs(args.repeats, full)
    peft_model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))

    def adapter(directory: Path) -> Path:
        peft_model.save_pretrained(str(directory))
        return directory

    lora_s, lora_bytes = timed_runs(args.repeats, adapter)
    result = {
        "shape": args.shape,
        "parameters": sum(p.numel() for p in model.parameters()),
        "full": {"bytes": full_bytes, "seconds": round(full_s, 4)},
        "lora_r16": {"bytes": lora_bytes, "seconds": round(lora_s, 4)},
        "bytes_ratio": round(full_bytes / lora_bytes, 1),
    }
    print(json.dumps(result, indent=1))
    (RESULTS / f"sync-{args.shape}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
