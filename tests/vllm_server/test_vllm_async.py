"""async_generation against a real vLLM server (CPU build): the server generates the next
step's completions while the trainers train, a stop saves the completions in flight, and the
resumed run trains its first step on them.

One server (started as the launcher starts it: plan.make_plan -> server.VLLMServer) serves
three attempts on 2 CPU processes: a run stopped at step 3 (the stop file, as a time limit
does), its resume to step 5, and a resume from a copy of the checkpoint without the saved
completions. Server sampling is not seeded (a per-request seed stops vLLM's CPU engine), so
steps after the first resumed one differ between runs; the first resumed one must train on the
saved completions, which is what an uninterrupted run trains on at that step.
"""

from __future__ import annotations

import shutil
import sys
import time

import pytest
import torch

from helpers.procs import wait_until_gone
from helpers.recipes import SMOKE_VLLM, write_recipe
from helpers.resume import assert_resumed_from, event_count
from helpers.runs import child_env, run
from maxent_grpo.launch.plan import Environment, Ports, make_plan
from maxent_grpo.launch.processes import free_port
from maxent_grpo.launch.server import VLLMServer
from maxent_grpo.recipe import read_recipe
from maxent_grpo.rundir.checkpoints import clear_stop_request, last_complete_checkpoint
from maxent_grpo.rundir.events import read_events
from maxent_grpo.train.state import STATE_FILE

pytestmark = pytest.mark.vllm

STOP = "tests.helpers.stop_rewards:stop_at_step"


def step_metrics(output_dir) -> dict[int, dict]:
    """Each step's metrics (the last attempt's where steps repeat)."""
    found = {}
    for event in read_events(output_dir):
        if event["event"] == "step" and "loss" in event.get("metrics", {}):
            found[int(event["step"])] = event["metrics"]
    return found


def test_async_generation_overlaps_saves_in_flight_completions_and_resumes(tmp_path, tiny_model):
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
        max_steps=5,
        save_steps=1000,  # the only checkpoint before the end is the stop's
    )
    ports = Ports(vllm=free_port(), vllm_group=free_port(), main_process=free_port())
    plan = make_plan(
        Environment(python=sys.executable), read_recipe(["--config", str(recipe)]), ports
    )
    out = part / "out"
    server = VLLMServer(plan.server, tmp_path / "logs" / "vllm.log", child_env()).start()
    try:
        server.wait_until_healthy()
        env = dict(plan.train.env, MAXENT_GRPO_TEST_STOP_AT="3", MAXENT_GRPO_TEST_STOP_DIR=str(out))
        first = run(list(plan.train.command), timeout=900, **env)
        assert last_complete_checkpoint(out) == out / "checkpoint-3", (
            first.stdout[-4000:] + first.stderr[-2000:]
        )
        clear_stop_request(out)  # what the launcher does before the next attempt
        shutil.copytree(out, tampered / "out")
        before = event_count(out)
        second = run(list(plan.train.command), timeout=900, **env)
        assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-2000:]

        # The same checkpoint without the saved completions: its step 4 generates afresh.
        for path in (tampered / "out" / "checkpoint-3").glob("registered_state-*.pt"):
            saved = torch.load(path, weights_only=True)
            saved["pieces"]["async_generation"] = {"step": -1}
            torch.save(saved, path)
        tampered_recipe = write_recipe(tampered, base=recipe)
        command = [a if a != str(recipe) else str(tampered_recipe) for a in plan.train.command]
        tampered_before = event_count(tampered / "out")
        third = run(command, timeout=900, **dict(plan.train.env))
        assert third.returncode == 0, third.stdout[-4000:] + third.stderr[-2000:]
    finally:
        server.stop()
        left, _ = wait_until_gone({server.pid}, timeout=15)
    took = time.monotonic() - started
    print(f"\nMEASURED async generation, 3 attempts on 1 vLLM CPU server: {took:.0f}s")
    assert not left, left

    # No step lost: the resumed attempt ran exactly steps 4 and 5.
    log = second.stdout + second.stderr
    assert_resumed_from(out, before, checkpoint=3, max_steps=5, log=log)
    assert "async_generation: resumed with step 4's completions" in log
    steps = step_metrics(out)
    shown = ("async/prefetched", "async/staleness_max", "async/wait_s", "time/server_busy")
    print("MEASURED per step:", {s: {k: m.get(k) for k in shown} for s, m in steps.items()})
    # Step 1 has nothing generated ahead; every later step trains on completions the server
    # made while the step before trained, one policy version old.
    assert steps[1]["async/prefetched"] == 0.0
    for step in (2, 3, 4, 5):
        assert steps[step]["async/prefetched"] == 1.0, step
        assert steps[step]["async/staleness_max"] == 1.0, step

    # The stop saved step 4's completions (made from the weights of step 2) in the checkpoint,
    # and the resumed step 4 trained on exactly those.
    files = sorted((out / "checkpoint-3").glob(STATE_FILE.format("*")))
    assert len(files) == 2
    pieces = [torch.load(f, weights_only=True)["pieces"]["async_generation"] for f in files]
    main = next(p for p in pieces if p["payload"] is not None)
    assert (main["step"], main["version"]) == (4, 2)
    completion_ids, _ = main["payload"]
    mean_length = sum(len(ids) for ids in completion_ids) / len(completion_ids)
    assert steps[4]["completions/mean_length"] == pytest.approx(mean_length)

    # Without them, step 4 generated afresh (nothing prefetched), and the run went on.
    assert_resumed_from(tampered / "out", tampered_before, checkpoint=3, max_steps=5)
    changed = step_metrics(tampered / "out")
    assert changed[4]["async/prefetched"] == 0.0
    assert changed[5]["async/prefetched"] == 1.0
