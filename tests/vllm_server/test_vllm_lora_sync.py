"""vllm_weight_sync: lora against a real vLLM server (CPU build): only the adapter goes to the
server (vLLM's runtime LoRA loading), the server's completions come from it, and a run stopped
at a checkpoint and resumed sends the checkpoint's adapter before its first generation.

The session's shared LoRA server (shared_servers.py: started as the launcher starts it; this
recipe would start the same one) serves both attempts of one run: the resumed trainer finds it
holding the adapter of the stopped attempt's last sync (one step older than the checkpoint),
so a resume that did not push the checkpoint's adapter would show in TRL's logprob check at
once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from shared_servers import plan_on

from helpers.lora import max_logprob_change
from helpers.recipes import SMOKE_VLLM, write_recipe
from helpers.resume import assert_resumed_from, event_count
from helpers.runs import run, step_logs
from maxent_grpo.rundir.checkpoints import (
    clear_stop_request,
    last_complete_checkpoint,
    run_is_complete,
)
from maxent_grpo.train.vllm_sync import LORA_DIRNAME

pytestmark = pytest.mark.vllm


def test_lora_sync_sends_the_adapter_resumes_and_the_server_generates_with_it(
    tmp_path, tiny_model, lora_server
):
    started = time.monotonic()
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
        # The smoke rewards, and one that asks the run to stop at step 2 (weight 0).
        reward_funcs=[
            "answer_match",
            "format",
            "tag_count",
            "length",
            "tests.helpers.stop_rewards:stop_at_step",
        ],
        reward_weights=[1.0, 0.5, 0.5, 0.5, 0.0],
        max_completion_length=16,
        max_steps=4,
        save_steps=1000,  # the only checkpoint before the end is the stop's
    )
    plan, train_env = plan_on(lora_server, recipe)
    assert "--enable-lora --max-lora-rank 8" in " ".join(plan.server.command)
    assert plan.server.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    env = dict(train_env, MAXENT_GRPO_TEST_STOP_AT="2", MAXENT_GRPO_TEST_STOP_DIR=str(out))
    first = run(list(plan.train.command), timeout=900, **env)
    assert last_complete_checkpoint(out) == out / "checkpoint-2", (
        first.stdout[-4000:] + first.stderr[-2000:]
    )
    assert not run_is_complete(out)
    clear_stop_request(out)  # what the launcher does before the next attempt
    before = event_count(out)
    second = run(list(plan.train.command), timeout=900, **env)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-2000:]
    took = time.monotonic() - started
    print(f"\nMEASURED LoRA sync, 2 attempts on the shared vLLM CPU server (4 steps): {took:.0f}s")
    assert run_is_complete(out)
    assert_resumed_from(out, before, checkpoint=2, max_steps=4, log=second.stdout + second.stderr)

    steps = step_logs(out)
    assert sorted(steps) == [1, 2, 3, 4]
    model_bytes = sum(f.stat().st_size for f in Path(tiny_model).glob("*.safetensors"))
    sent = [steps[s]["vllm/weight_sync_bytes"] for s in sorted(steps)]
    print(f"MEASURED bytes per sync: adapter {sent}, full model {model_bytes}")
    assert all(0 < b < model_bytes / 2 for b in sent)
    # TRL's check at every step: the server's logprobs of the tokens it sampled against the
    # trainer's (adapter active): equal only if the server generated with the newest adapter,
    # on the resumed steps 3 and 4 too.
    differences = [steps[s]["sampling/sampling_logp_difference/max"] for s in sorted(steps)]
    print(f"MEASURED server vs trainer max logprob difference per step: {differences}")
    assert max(differences) < 1e-4
    change = max_logprob_change(tiny_model, out)
    print(f"MEASURED the adapter's max logprob change vs the base model: {change:.3g}")
    assert change > 1e-3  # a server generating with the base model would have been far off
    # Only the adapter the server holds now is left (the stopped attempt's one was removed
    # at the resumed attempt's first sync).
    assert len(list((out / LORA_DIRNAME).iterdir())) == 1
