"""Rollout filters and generation rounds (docs/rollouts.md) with generation on a real vLLM
server (CPU build): every extra round goes through the server, and the server stays on the
trained weights throughout.

The launcher's trainers of the MaxEnt smoke recipe in vLLM server mode, against the session's
shared disk-sync server (shared_servers.py; the recipe would start the very same one), 6 short
steps on 2 CPU processes: its rewards give the untrained tiny model mostly groups without reward
spread (a group has spread only when a completion ends before the length penalty's last token,
about 1 in 20 completions), so `nonzero_std` drops most groups and later rounds generate again.
Server sampling is not seeded: the sizes below make a step with some process short after its
first round, and a step that trains, near certain (8 completions a group, 2 groups a process
in the first round, up to 4 in 3 rounds).
"""

from __future__ import annotations

import time

import pytest
import yaml
from shared_servers import SHARED_KEYS, plan_on

from helpers.recipes import SMOKE_MAXENT, SMOKE_VLLM, write_recipe
from helpers.runs import run
from maxent_grpo.rundir.checkpoints import run_is_complete
from maxent_grpo.rundir.events import read_events

pytestmark = pytest.mark.vllm

# The server keys of the vLLM smoke recipe (server mode, CPU server, disk sync), on the MaxEnt
# smoke recipe.
SERVER_KEYS = {
    key: value
    for key, value in yaml.safe_load(SMOKE_VLLM.read_text()).items()
    if key == "use_vllm" or key.startswith("vllm_")
}


def step_metrics(output_dir) -> dict[int, dict]:
    """Each step's metrics (not the end-of-training summary, which repeats the last step)."""
    return {
        int(e["step"]): e["metrics"]
        for e in read_events(output_dir)
        if e["event"] == "step" and "rollouts/rounds" in e.get("metrics", {})
    }


def test_filters_and_rounds_generate_through_the_server_and_stay_in_sync(
    tmp_path, tiny_model, disk_server
):
    out = tmp_path / "out"
    recipe = write_recipe(
        tmp_path,
        base=SMOKE_MAXENT,
        **{**SERVER_KEYS, **SHARED_KEYS["disk"]},
        model_name_or_path=str(tiny_model),
        rollout_filters=["nonzero_std"],
        max_generation_rounds=3,
        oversample_factor=2.0,
        num_generations=8,
        per_device_train_batch_size=8,  # one group a process
        max_completion_length=32,  # the length penalty (overlong_buffer 16) needs 32 tokens
        max_steps=6,
        save_steps=1000,
    )
    plan, env = plan_on(disk_server, recipe)
    started = time.monotonic()
    result = run(list(plan.train.command), timeout=900, **env)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert run_is_complete(out)
    print(f"\nMEASURED rollouts against the shared vLLM CPU server, 6 steps: {took:.0f}s")

    steps = step_metrics(out)
    assert sorted(steps) == [1, 2, 3, 4, 5, 6]
    shown = {
        "zero_std": "frac_reward_zero_std",
        "rounds": "rollouts/rounds",
        "generated": "rollouts/groups_generated",
        "kept": "rollouts/groups_kept",
        "trained": "rollouts/groups_trained",
        "carried_in": "rollouts/carried_in",
        "skipped": "rollouts/skipped",
        "logp_diff": "sampling/sampling_logp_difference/max",
    }
    table = {s: {label: m.get(key) for label, key in shown.items()} for s, m in steps.items()}
    print(f"MEASURED per step: {table}")
    log = result.stdout + result.stderr
    for step, metrics in steps.items():
        if metrics["rollouts/skipped"]:
            assert f"rollouts: step {step} skipped" in log
            continue
        # Only groups with reward spread were trained on.
        assert metrics["frac_reward_zero_std"] == 0.0, (step, metrics)
        if metrics["rollouts/groups_trained"] < 2:  # 2 processes x 1 group
            assert f"rollouts: step {step} trains on" in log
    assert any(not m["rollouts/skipped"] for m in steps.values()), table  # some step trained
    # The filter dropped groups and a later round generated again, through the server.
    assert any(m["rollouts/rounds"] > 1 for m in steps.values()), table
    # TRL's check on every generation (every round): the server's logprobs of the tokens it
    # sampled against the trainer's: equal only if the server had the trained weights. (A step
    # that trains on carried-over groups alone generates nothing and has no such metric.)
    key = "sampling/sampling_logp_difference/max"
    differences = [m[key] for m in steps.values() if key in m]
    assert differences and max(differences) < 1e-4, differences
