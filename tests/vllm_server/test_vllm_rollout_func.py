"""A recipe's own rollout function (docs/rollouts.md) generating on a real vLLM server (CPU
build): the shipped two-turn self-check (maxent_grpo.train.rollout_func:self_check) through
`generate`, the launcher's 2 CPU trainers of the GRPO vLLM smoke recipe against a disk-sync
server of its own (shared_servers.py says why), 4 short steps.

Server sampling is not seeded and the untrained tiny model seldom ends an answer (EOS) early,
so how many answers get their second turn varies (printed, and counted by a weight-0 reward:
12-25 % of the completions per step when it was written);
what must hold on every generation is TRL's check of the server's log-probabilities against
the trainer's, over the policy's tokens (the check text is out of it): equal only when the
server has the trained weights and the function's completions line up with their logprobs.
"""

from __future__ import annotations

import time

import pytest
from shared_servers import SHARED_KEYS, plan_on

from helpers.recipes import SMOKE_VLLM, write_recipe
from helpers.runs import run
from maxent_grpo.rundir.checkpoints import run_is_complete
from maxent_grpo.rundir.events import read_events

pytestmark = pytest.mark.vllm


def test_a_rollout_func_generates_through_the_server_in_sync(
    tmp_path, tiny_model, rollout_func_server
):
    out = tmp_path / "out"
    recipe = write_recipe(
        tmp_path,
        base=SMOKE_VLLM,
        **SHARED_KEYS["rollout_func"],
        model_name_or_path=str(tiny_model),
        rollout_func="maxent_grpo.train.rollout_func:self_check",
        reward_funcs=["length", "tests.helpers.rollout_funcs:was_checked"],
        reward_weights=[1.0, 0.0],
        num_generations=8,
        num_processes=2,
        per_device_train_batch_size=16,  # 2 groups a process
        max_completion_length=96,  # room for an answer, the check text and a second turn
        max_steps=4,
        save_steps=1000,
    )
    plan, env = plan_on(rollout_func_server, recipe)
    started = time.monotonic()
    result = run(list(plan.train.command), timeout=900, **env)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert run_is_complete(out)
    steps = {
        int(e["step"]): e["metrics"]
        for e in read_events(out)
        if e["event"] == "step" and "loss" in e.get("metrics", {})
    }
    assert sorted(steps) == [1, 2, 3, 4]
    checked = [m["rewards/was_checked/mean"] for m in steps.values()]
    key = "sampling/sampling_logp_difference/max"
    differences = [m[key] for m in steps.values()]
    print(
        f"\nMEASURED rollout_func on its own vLLM CPU server, 4 steps: {took:.0f}s; "
        f"share self-checked per step {checked}; logp difference max {differences}"
    )
    assert max(differences) < 1e-4, differences
    # Some answers got their second turn from the server (about 1 in 5 completions ends early
    # enough: none in 128 would be a broken self-check, not chance).
    assert sum(checked) > 0, checked
