"""LoRA (use_peft) against a real vLLM server (CPU build) with disk weight sync, through the
launcher, stopped after step 2 and resumed: the server must always generate with the current
adapters merged into the weights (TRL's _iter_named_params merges them for every sync)."""

from __future__ import annotations

import time

import pytest

from helpers.lora import max_logprob_change
from helpers.paths import MAXENT_GRPO
from helpers.recipes import SMOKE_VLLM, write_recipe
from helpers.runs import run, step_logs
from maxent_grpo.errors import EXIT_CHECKPOINTED
from maxent_grpo.rundir.checkpoints import last_complete_checkpoint, run_is_complete

pytestmark = pytest.mark.vllm


def test_lora_with_vllm_server_and_disk_sync_stops_resumes_and_stays_in_sync(tmp_path, tiny_model):
    started = time.monotonic()
    out, logs = tmp_path / "out", tmp_path / "logs"
    recipe = write_recipe(
        tmp_path,
        base=SMOKE_VLLM,
        model_name_or_path=str(tiny_model),
        use_peft=True,
        lora_r=16,
        lora_alpha=32,
        lora_target_modules="all-linear",
        lora_dropout=0.0,  # dropout in the trainer's logprobs would differ from the server's
        learning_rate=1.0e-2,
        reward_funcs=["digit_fraction", "tests.helpers.stop_rewards:stop_at_step"],
        reward_weights=[1.0, 0.0],
        max_completion_length=16,
        max_steps=4,
        save_steps=1000,  # the only checkpoint before the end is the stop's
    )
    command = [MAXENT_GRPO, "run", "--config", str(recipe), "--logs-dir", str(logs)]
    env = dict(MAXENT_GRPO_TEST_STOP_AT="2", MAXENT_GRPO_TEST_STOP_DIR=str(out))
    first = run(command, timeout=900, **env)
    assert first.returncode == EXIT_CHECKPOINTED, first.stdout[-4000:] + first.stderr[-2000:]
    assert last_complete_checkpoint(out) == out / "checkpoint-2"
    second = run(command, timeout=900, **env)  # the launcher clears the stop request itself
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-2000:]
    took = time.monotonic() - started
    print(f"\nMEASURED LoRA + vLLM CPU server, 2 attempts (2 server starts, 4 steps): {took:.0f}s")
    assert run_is_complete(out) and (out / "adapter_model.safetensors").is_file()
    assert "Resuming from" in "".join(p.read_text() for p in logs.glob("*_train.log"))

    steps = step_logs(out)
    assert sorted(steps) == [1, 2, 3, 4]
    assert all(steps[s]["vllm/weight_sync_seconds"] > 0 for s in steps)
    # TRL's check at every step: the server's logprobs of the tokens it sampled vs the
    # trainer's (adapters active). Equal only if each sync pushed the merged weights, also
    # right after the resume, into a server that started from the base model.
    differences = [steps[s]["sampling/sampling_logp_difference/max"] for s in sorted(steps)]
    print(f"MEASURED server vs trainer max logprob difference per step: {differences}")
    assert max(differences) < 1e-4
    change = max_logprob_change(tiny_model, out)
    print(f"MEASURED adapters' max logprob change vs the base model: {change:.3g}")
    assert change > 1e-3  # so a server without the adapters would have been far off
    assert not (out / ".vllm_weights").exists()  # every sync directory was removed
