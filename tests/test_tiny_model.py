import fcntl
import subprocess
import sys
import time

from transformers import AutoModelForCausalLM, AutoTokenizer

from maxent_grpo.tiny_model import _build_tokenizer, build_tiny_model, ensure_tiny_model, is_current


def test_tiny_model_is_vllm_cpu_compatible_and_round_trips(tmp_path):
    path = build_tiny_model(tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(path)
    # vLLM's CPU attention rejects head_dim 16; weight reloads break with tied embeddings.
    assert model.config.head_dim >= 32
    assert model.config.tie_word_embeddings is False
    assert model.config.model_type == "qwen2"

    loaded = AutoTokenizer.from_pretrained(path)
    text = "What is 12 + 7 * 3?\n<think>\nok</think>\n<answer>\n33\n</answer> héllo 🙂"
    assert loaded(text)["input_ids"] == _build_tokenizer()(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == text
    prompt = loaded.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert loaded.eos_token == "<|im_end|>"


def test_ensure_tiny_model_reuses_the_cache(tmp_path):
    path = ensure_tiny_model(tmp_path / "m")
    assert is_current(path)
    weights = path / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert ensure_tiny_model(tmp_path / "m") == path
    assert weights.stat().st_mtime_ns == mtime


def test_a_second_process_waits_for_the_first_build_and_reuses_it(tmp_path):
    """Two test workers (or ranks) starting at once build the model once: the second waits on
    the lock beside it, then finds it current (before the lock it rebuilt it, deleting the
    directory under a reader)."""
    out = tmp_path / "m"
    code = f"from maxent_grpo.tiny_model import ensure_tiny_model; ensure_tiny_model({str(out)!r})"
    with open(tmp_path / ".m.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first build
        second = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(2)  # the second finds no model and waits for the lock
        build_tiny_model(out)
        built = (out / "model.safetensors").stat().st_ino
    assert second.wait(timeout=120) == 0
    assert (out / "model.safetensors").stat().st_ino == built  # not built again
