"""vllm_weight_sync: lora against a real vLLM server (CPU build): only the adapter goes to the
server (vLLM's runtime LoRA loading), and the server's completions come from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.lora import max_logprob_change
from helpers.paths import MAXENT_GRPO
from helpers.recipes import SMOKE_VLLM, write_recipe
from helpers.runs import run, step_logs
from maxent_grpo.rundir.checkpoints import run_is_complete

pytestmark = pytest.mark.vllm


def test_lora_sync_sends_the_adapter_and_the_server_generates_with_it(tmp_path, tiny_model):
    out = tmp_path / "out"
    recipe = write_recipe(
        tmp_path,
        base=SMOKE_VLLM,
        model_name_or_path=str(tiny_model),
        use_peft=True,
        lora_r=8,
        lora_alpha=16,
        lora_target_modules="all-linear",
        lora_dropout=0.0,  # dropout in the trainer's logprobs would differ from the server's
        learning_rate=3.0e-2,
        vllm_weight_sync="lora",
        max_completion_length=16,
        max_steps=3,
        output_dir=str(out),
    )
    result = run([MAXENT_GRPO, "run", "--config", str(recipe)], timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "--enable-lora --max-lora-rank 8" in result.stdout
    assert run_is_complete(out)

    steps = step_logs(out)
    model_bytes = sum(f.stat().st_size for f in Path(tiny_model).glob("*.safetensors"))
    sent = [steps[s]["vllm/weight_sync_bytes"] for s in sorted(steps)]
    print(f"\nMEASURED bytes per sync: adapter {sent[0]:.0f}, full model {model_bytes}")
    assert all(0 < b < model_bytes / 2 for b in sent)
    # TRL's check at every step: the server's logprobs of the tokens it sampled against the
    # trainer's (adapter active): equal only if the server generated with the newest adapter.
    differences = [steps[s]["sampling/sampling_logp_difference/max"] for s in sorted(steps)]
    print(f"MEASURED server vs trainer max logprob difference per step: {differences}")
    assert max(differences) < 1e-4
    change = max_logprob_change(tiny_model, out)
    print(f"MEASURED the adapter's max logprob change vs the base model: {change:.3g}")
    assert change > 1e-3  # a server generating with the base model would have been far off
