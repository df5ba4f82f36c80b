"""LoRA (use_peft) with the real peft package: it learns, saves an adapter, resumes exactly.

The vLLM side (adapters merged into the weights the server reloads) is in
tests/vllm_server/test_vllm_lora.py.
"""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

from helpers.paths import PYTHON, REPO, SMOKE_LORA
from helpers.recipes import small_recipe
from helpers.resume import assert_resumed_from, event_count, mark_tampered
from helpers.runs import run, step_logs
from maxent_grpo.errors import EXIT_CHECKPOINTED
from maxent_grpo.rundir.checkpoints import (
    clear_stop_request,
    last_complete_checkpoint,
)

pytestmark = pytest.mark.integration

GRPO = str(REPO / "src" / "grpo.py")


def test_lora_learns_and_saves_an_adapter(tmp_path, tiny_model):
    import torch
    from peft import AutoPeftModelForCausalLM
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    recipe = small_recipe(
        tmp_path,
        tiny_model,
        SMOKE_LORA,
        max_completion_length=16,
        reward_funcs=["digit_fraction"],
        reward_weights=None,
        per_device_train_batch_size=16,
        max_steps=30,
        save_strategy="no",
        # The random tiny model climbs digit_fraction through its output layer: train it in
        # full beside the adapters (PEFT's modules_to_save), as a classification head would be.
        lora_modules_to_save=["lm_head"],
    )
    result = run([PYTHON, GRPO, "--config", str(recipe)])
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "out"
    rewards = [float(log["reward"]) for _, log in sorted(step_logs(out).items())]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"LoRA mean reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    assert last > first + 0.1

    # The output is an adapter over the untouched base model, and it changes the model.
    assert not (out / "model.safetensors").exists()
    adapter = load_file(out / "adapter_model.safetensors")
    lora_b = [t.abs().max().item() for name, t in adapter.items() if "lora_B" in name]
    assert len(lora_b) == 14 and min(lora_b) > 0  # every adapter trained (lora_B starts at 0)
    ids = torch.tensor([list(range(3, 40))])
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(tiny_model).eval()(ids).logits
        tuned = AutoPeftModelForCausalLM.from_pretrained(out).eval()(ids).logits
    assert (tuned - base).abs().max() > 1e-3


def test_stopped_lora_run_resumes_exactly_like_an_uninterrupted_one(tmp_path, tiny_model):
    stop = "tests.helpers.stop_rewards:stop_at_step"
    keys = dict(reward_funcs=["digit_fraction", stop], reward_weights=[1.0, 0.0])
    full = small_recipe(tmp_path / "full", tiny_model, SMOKE_LORA, **keys)
    assert run([PYTHON, GRPO, "--config", str(full)]).returncode == 0

    part = small_recipe(tmp_path / "part", tiny_model, SMOKE_LORA, **keys)
    out = tmp_path / "part" / "out"
    env = dict(MAXENT_GRPO_TEST_STOP_AT="2", MAXENT_GRPO_TEST_STOP_DIR=str(out))
    first = run([PYTHON, GRPO, "--config", str(part)], **env)
    assert first.returncode == EXIT_CHECKPOINTED, first.stderr[-3000:]
    checkpoint = last_complete_checkpoint(out)
    assert checkpoint == out / "checkpoint-2"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    clear_stop_request(out)
    tampered = small_recipe(tmp_path / "tampered", tiny_model, SMOKE_LORA, **keys)
    shutil.copytree(out, tmp_path / "tampered" / "out")
    before = event_count(out)
    second = run([PYTHON, GRPO, "--config", str(part)], **env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert_resumed_from(out, before, 2, max_steps=4, log=second.stdout + second.stderr)

    full_logs, resumed = step_logs(tmp_path / "full" / "out"), step_logs(out)
    assert sorted(resumed) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in ("loss", "reward", "grad_norm", "entropy"):
            assert float(resumed[step][key]) == pytest.approx(
                float(full_logs[step][key]), rel=1e-5, abs=1e-7
            ), (step, key)

    # The adapter is loaded from the checkpoint: with its lora_B zeroed (the adapter of step
    # 0), step 3 samples and scores other completions.
    adapter = tmp_path / "tampered" / "out" / "checkpoint-2" / "adapter_model.safetensors"
    tensors = load_file(str(adapter))
    save_file({k: v * 0 if "lora_B" in k else v for k, v in tensors.items()}, str(adapter))
    mark_tampered(adapter.parent)
    before = event_count(tmp_path / "tampered" / "out")
    assert run([PYTHON, GRPO, "--config", str(tampered)]).returncode == 0
    assert_resumed_from(tmp_path / "tampered" / "out", before, 2, max_steps=4)
    third = step_logs(tmp_path / "tampered" / "out")[3]
    assert float(third["entropy"]) != pytest.approx(float(resumed[3]["entropy"]), rel=1e-5)
