"""async_generation against a real vLLM server (CPU build), with MaxEnt-GRPO, a rollout filter,
LoRA sync and over-sampling: the server generates the next step's completions while the
trainers train, a stop saves the completions in flight, and the resumed run trains its first
step on them.

The session's shared LoRA server (shared_servers.py: started as the launcher starts it, with
runtime LoRA; this recipe would start the same one) serves three attempts on 2 CPU processes:
a run stopped at step 4 (the stop file, as a time limit does), its resume to step 7, and a
resume from a copy of the checkpoint without the saved completions. Only the adapter goes to
the server (`vllm_weight_sync: lora`). `oversample_factor: 1.5` with 2 groups a process: each
first round generates 3 groups, the surplus is carried over, and every third step is filled by
carried groups alone (steps 3 and 6: no generation). The next request is sent once the step's
rounds are decided, for the next first round's own and extra prompts, so every step that
generates (after the first) trains on completions made ahead. The trainer is MaxEnt-GRPO
(`method: maxent`, tau adapting to a target weight entropy): its weights and its tau
controller are fed by the completions made ahead, and the controller's state travels with the
checkpoint that holds them. The rollout filter `diverse` judges every round, the one made
ahead included (a random tiny model's 16-token completions are never all the same). That the
resumed steps equal an uninterrupted run's, with seeded sampling, is
tests/slurm/test_async_preemption.py.
"""

from __future__ import annotations

import shutil
import time

import pytest
import torch
from shared_servers import plan_on

from helpers.recipes import SMOKE_VLLM, TWO_TRAINERS, write_recipe
from helpers.resume import assert_resumed_from, event_count, mark_tampered, saved_ahead
from helpers.runs import run
from maxent_grpo.rundir.checkpoints import (
    clear_stop_request,
    last_complete_checkpoint,
)
from maxent_grpo.rundir.events import read_events
from maxent_grpo.train.state import STATE_FILE

pytestmark = pytest.mark.vllm

STOP = "tests.helpers.stop_rewards:stop_at_step"
STEPS, STOP_AT = 7, 4
LORA = dict(
    use_peft=True,
    lora_r=8,
    lora_alpha=16,
    lora_target_modules="all-linear",
    lora_dropout=0.0,
    vllm_weight_sync="lora",
)


# MaxEnt-GRPO with tau adapting every step (the smoke MaxEnt recipe's controller settings).
MAXENT = dict(method="maxent", maxent_target_weight_entropy=1.2, maxent_tau_lr=0.5)


def step_metrics(output_dir) -> dict[int, dict]:
    """Each step's metrics (the last attempt's where steps repeat)."""
    found = {}
    for event in read_events(output_dir):
        if event["event"] == "step" and "loss" in event.get("metrics", {}):
            found[int(event["step"])] = event["metrics"]
    return found


def assert_maxent_and_filter(steps: dict[int, dict], changed: dict[int, dict]) -> None:
    """MaxEnt weighted the completions made ahead and the filter judged them (it keeps all);
    MaxEnt's tau, moved by steps 1-4, is the checkpoint's in both resumes (not restarted)."""
    for step in (2, 4, 5, 7):
        assert 0.0 < steps[step]["maxent/weight_entropy"] <= 1.3863, step  # <= log 4
        assert steps[step]["rollouts/kept_fraction/diverse"] == 1.0, step
    taus = [steps[1]["maxent/tau"], steps[STOP_AT + 1]["maxent/tau"]]
    assert taus[1] != pytest.approx(taus[0]), taus
    assert changed[STOP_AT + 1]["maxent/tau"] == pytest.approx(taus[1]), taus


def test_async_generation_overlaps_saves_in_flight_completions_and_resumes(
    tmp_path, tiny_model, lora_server
):
    started = time.monotonic()
    part, tampered = tmp_path / "part", tmp_path / "tampered"
    recipe = write_recipe(
        part,
        base=SMOKE_VLLM,
        model_name_or_path=str(tiny_model),
        async_generation=True,
        reward_funcs=["answer_match", "format", "tag_count", "length", STOP],
        reward_weights=[1.0, 0.5, 0.5, 0.5, 0.0],
        max_completion_length=16,
        max_steps=STEPS,
        save_steps=1000,  # the only checkpoint before the end is the stop's
        num_processes=2,
        per_device_train_batch_size=8,  # 2 groups a process
        oversample_factor=1.5,
        rollout_filters=["diverse"],
        **MAXENT,
        **LORA,
    )
    plan, train_env = plan_on(lora_server, recipe)
    assert "--enable-lora" in plan.server.command
    out = part / "out"
    stop = dict(MAXENT_GRPO_TEST_STOP_AT=str(STOP_AT), MAXENT_GRPO_TEST_STOP_DIR=str(out))
    env = dict(train_env, **stop)
    first = run(list(plan.train.command), timeout=900, **env)
    assert last_complete_checkpoint(out) == out / f"checkpoint-{STOP_AT}", (
        first.stdout[-4000:] + first.stderr[-2000:]
    )
    clear_stop_request(out)  # what the launcher does before the next attempt
    shutil.copytree(out, tampered / "out")
    before = event_count(out)
    second = run(list(plan.train.command), timeout=900, **env)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-2000:]

    # The same checkpoint without the saved completions: its step 5 generates afresh.
    for path in (tampered / "out" / f"checkpoint-{STOP_AT}").glob("registered_state-*.pt"):
        saved = torch.load(path, weights_only=True)
        saved["pieces"]["async_generation"] = {"items": []}
        torch.save(saved, path)
    mark_tampered(tampered / "out" / f"checkpoint-{STOP_AT}")
    tampered_recipe = write_recipe(tampered, base=recipe)
    command = [a if a != str(recipe) else str(tampered_recipe) for a in plan.train.command]
    tampered_before = event_count(tampered / "out")
    third = run(command, timeout=900, **train_env)
    assert third.returncode == 0, third.stdout[-4000:] + third.stderr[-2000:]
    took = time.monotonic() - started
    print(f"\nMEASURED async generation, 3 attempts on the shared vLLM CPU server: {took:.0f}s")

    # No step lost: the resumed attempt ran exactly steps 5 to 7.
    log = second.stdout + second.stderr
    assert_resumed_from(out, before, checkpoint=STOP_AT, max_steps=STEPS, log=log)
    assert f"async_generation: resumed with steps [{STOP_AT + 1}] generated ahead" in log
    steps = step_metrics(out)
    shown = ("rollouts/rounds", "async/prefetched", "async/staleness_max", "async/wait_s")
    print("MEASURED per step:", {s: {k: m.get(k) for k in shown} for s, m in steps.items()})
    # Step 1 has nothing generated ahead; every later step that generates trains on
    # completions the server made ahead, one policy version old, first round included (3
    # groups a process: its own 2 and 1 extra). Steps 3 and 6 are filled by carried groups.
    rounds = {s: m["rollouts/rounds"] for s, m in steps.items()}
    assert rounds == {1: 1, 2: 1, 3: 0, 4: 1, 5: 1, 6: 0, 7: 1}, rounds
    assert steps[1]["async/prefetched"] == 0.0
    for step in (2, 4, 5, 7):
        assert steps[step]["async/prefetched"] == 1.0, step
        assert steps[step]["async/staleness_max"] == 1.0, step
        assert steps[step]["rollouts/groups_generated"] == 6.0, step
    assert all("async/prefetched" not in steps[s] for s in (3, 6))
    # Only the adapter went to the server: a few KB, not the model.
    sent = [m["vllm/weight_sync_bytes"] for m in steps.values() if "vllm/weight_sync_bytes" in m]
    assert sent and all(0 < size < 200_000 for size in sent), sent

    # The stop saved step 5's completions (made from the weights of step 3) in the checkpoint,
    # and the resumed step 5 trained on exactly those.
    files = sorted((out / f"checkpoint-{STOP_AT}").glob(STATE_FILE.format("*")))
    assert len(files) == 2
    pieces = [torch.load(f, weights_only=True)["pieces"]["async_generation"] for f in files]
    main = next(saved_ahead(p) for p in pieces if saved_ahead(p)[0][2] is not None)
    assert [(step, version) for step, version, _ in main] == [(STOP_AT + 1, STOP_AT - 1)]
    completion_ids = main[0][2]
    assert len(completion_ids) == 2 * 3 * 4  # 2 processes x 3 groups x 4 completions
    mean_length = sum(len(ids) for ids in completion_ids) / len(completion_ids)
    assert steps[STOP_AT + 1]["completions/mean_length"] == pytest.approx(mean_length)

    # Without them, step 5 generated afresh (nothing prefetched), and the run went on.
    assert_resumed_from(tampered / "out", tampered_before, checkpoint=STOP_AT, max_steps=STEPS)
    changed = step_metrics(tampered / "out")
    assert changed[STOP_AT + 1]["async/prefetched"] == 0.0
    assert changed[STEPS]["async/prefetched"] == 1.0
    assert_maxent_and_filter(steps, changed)


def test_two_steps_ahead_in_chunks_with_maxent_and_lora_resume_on_the_saved_prefixes(
    tmp_path, tiny_model, lora_server
):
    """`max_staleness: 2` (two steps ahead) with partial rollouts (8-token chunks of 24-token
    completions), MaxEnt-GRPO and LoRA sync, 2 processes, on the shared LoRA server: every
    step after the second trains on completions two policy versions old; stopped at step 3,
    the checkpoint holds steps 4 and 5, and the resumed run trains
    on them (no step regenerated: each is prefetched, two versions old)."""
    out = tmp_path / "deep" / "out"
    recipe = write_recipe(
        tmp_path / "deep",
        base=SMOKE_VLLM,
        model_name_or_path=str(tiny_model),
        async_generation=True,
        max_staleness=2,
        partial_rollout_tokens=8,
        reward_funcs=["answer_match", "format", "tag_count", "length", STOP],
        reward_weights=[1.0, 0.5, 0.5, 0.5, 0.0],
        max_completion_length=24,
        max_steps=6,
        save_steps=1000,
        **TWO_TRAINERS,
        **MAXENT,
        **LORA,
    )
    plan, train_env = plan_on(lora_server, recipe)
    env = dict(train_env, MAXENT_GRPO_TEST_STOP_AT="3", MAXENT_GRPO_TEST_STOP_DIR=str(out))
    first = run(list(plan.train.command), timeout=900, **env)
    assert last_complete_checkpoint(out) == out / "checkpoint-3", first.stdout[-4000:]
    clear_stop_request(out)
    pieces = [
        torch.load(f, weights_only=True)["pieces"]["async_generation"]
        for f in sorted((out / "checkpoint-3").glob(STATE_FILE.format("*")))
    ]
    main = next(saved_ahead(p) for p in pieces if saved_ahead(p)[0][2] is not None)
    assert [(step, version) for step, version, _ in main] == [(4, 1), (5, 2)], main
    second = run(list(plan.train.command), timeout=900, **env)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-2000:]
    assert "async_generation: resumed with steps [4, 5] generated ahead" in second.stdout

    steps = step_metrics(out)
    assert sorted(steps) == [1, 2, 3, 4, 5, 6]
    assert steps[1]["async/prefetched"] == 0.0
    assert [steps[s]["async/prefetched"] for s in range(2, 7)] == [1.0] * 5
    assert [steps[s]["async/staleness_max"] for s in range(2, 7)] == [1.0, 2.0, 2.0, 2.0, 2.0]
    assert steps[4]["async/tokens_kept"] > 0  # the resumed run's first step, on saved work
    for step in range(2, 7):  # MaxEnt weighted the completions made ahead
        assert 0.0 < steps[step]["maxent/weight_entropy"] <= 1.3863, step
