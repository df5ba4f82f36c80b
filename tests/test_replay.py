"""Replay (train/replay.py): the buffer's decisions, the recipe checks, and real CPU runs.

The unit tests use the buffer alone. The integration tests train the tiny model: one in
process, reading what TRL's loss gets (a replayed group carries the logprobs of the policy
that made it, so its importance ratio is not 1), three runs of `maxent-grpo run` on 2 CPU
processes (4 steps; stopped after step 2, then resumed), whose events must show the replayed
share and age, and whose resumed steps must be those of the uninterrupted run (a buffer not
restored replays nothing at step 3), and the benchmark's smallest case.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from helpers.paths import MAXENT_GRPO, SMOKE_VLLM
from helpers.recipes import small_recipe, write_recipe
from helpers.resume import assert_resumed_from, event_count
from helpers.runs import PYTHON, run
from maxent_grpo.errors import ConfigError
from maxent_grpo.recipe.keys import GRPOConfig
from maxent_grpo.rundir.events import read_events
from maxent_grpo.train.group_batches import merge_groups
from maxent_grpo.train.replay import Buffered, ReplayBuffer, draw, group_priority
from maxent_grpo.train.state import STATE_FILE

# 2 groups of 4 per process and step: one fresh, one replayed.
REPLAY = dict(
    reward_funcs=["digit_fraction"],
    reward_weights=None,
    num_generations=4,
    per_device_train_batch_size=8,
    learning_rate=1.0e-2,
    replay_share=0.5,
    replay_priority="spread",
)


def group(priority: float, step: int) -> Buffered:
    return Buffered({"advantages": torch.zeros(4)}, [0.0] * 4, priority, step)


# ---- the decisions ----------------------------------------------------------------------


def test_a_draw_prefers_high_priority_and_never_repeats_a_group():
    rng = random.Random(0)
    counts = [0, 0, 0, 0]
    for _ in range(4000):
        chosen = draw([0.1, 3.0, 0.5, 1.0], 2, rng)
        assert len(set(chosen)) == 2
        for i in chosen:
            counts[i] += 1
    # by rank 1 (index 1), 2 (index 3), 3 (index 2), 4 (index 0)
    assert counts[1] > counts[3] > counts[2] > counts[0] > 0, counts
    assert draw([1.0, 2.0], 5, rng) in ([1, 0], [0, 1])  # at most what there is


def test_priorities_of_a_group():
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    rewards = [0.0, 1.0, float("nan"), 0.25]
    assert group_priority("advantage", rewards, advantages) == 0.75
    assert group_priority("spread", rewards, advantages) == 1.0
    assert group_priority("reward", rewards, advantages) == pytest.approx(1.25 / 3)


def test_old_groups_and_a_full_buffer_are_evicted_and_counted():
    buffer = ReplayBuffer(size=3, max_age=2, kind="spread")
    assert buffer.add([group(1.0, 1), group(1.0, 2)]) == 0
    assert buffer.add([group(1.0, 3), group(1.0, 4)]) == 1  # the oldest (step 1) goes
    assert [g.step for g in buffer.groups] == [2, 3, 4]
    assert buffer.evict_old(now=5) == 1  # step 2 is 3 steps behind step 5
    assert [g.step for g in buffer.groups] == [3, 4]


def test_a_group_without_signal_is_replayed_only_by_reward():
    for kind, eligible in (("spread", [1]), ("advantage", [1]), ("reward", [0, 1])):
        buffer = ReplayBuffer(size=4, max_age=4, kind=kind)
        buffer.add([group(0.0, 1), group(0.5, 1)])
        assert buffer.eligible() == eligible, kind


def test_the_buffer_round_trips_through_its_state():
    buffer = ReplayBuffer(size=4, max_age=4, kind="reward")
    buffer.add([group(0.5, 3)])
    again = ReplayBuffer(size=4, max_age=4, kind="reward")
    again.load_state_dict(buffer.state_dict())
    assert [(g.priority, g.step, g.rewards) for g in again.groups] == [(0.5, 3, [0.0] * 4)]


def test_groups_of_different_widths_merge_padded_on_their_side():
    a = {"prompt_ids": torch.tensor([[5, 6]]), "completion_ids": torch.tensor([[7]])}
    b = {"prompt_ids": torch.tensor([[8]]), "completion_ids": torch.tensor([[9, 10]])}
    batch = merge_groups([a, b], pad_token_id=0)
    assert batch["prompt_ids"].tolist() == [[5, 6], [0, 8]]  # prompts: left
    assert batch["completion_ids"].tolist() == [[7, 0], [9, 10]]  # completions: right


# ---- the recipe checks --------------------------------------------------------------------


def grpo(**keys) -> GRPOConfig:
    return GRPOConfig(output_dir="/tmp/x", use_cpu=True, num_generations=4, **keys)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (dict(per_device_train_batch_size=4), "needs at least 2 (one fresh, one replayed)"),
        (
            dict(per_device_train_batch_size=12, replay_share=0.3),
            "set replay_share to at least 0.34",
        ),
        (dict(replay_buffer_size=1, per_device_train_batch_size=16), "replay_buffer_size: 1"),
        (dict(per_device_train_batch_size=6, generation_batch_size=12), "whole groups"),
        (dict(rollout_filters=["nonzero_std"]), "does not yet work with generation rounds"),
    ],
)
def test_replay_refuses_what_it_cannot_do_in_one_line(keys, message):
    keys = {"per_device_train_batch_size": 8, "replay_share": 0.5, **keys}
    with pytest.raises(ConfigError) as exc:
        grpo(**keys)
    lines = str(exc.value).splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_check_refuses_replay_with_async_generation(tmp_path, tiny_model, capsys):
    from maxent_grpo import cli

    path = write_recipe(
        tmp_path,
        SMOKE_VLLM,
        model_name_or_path=str(tiny_model),
        **{**REPLAY, "async_generation": True},
    )
    assert cli.main(["check", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "replay_share: 0.5 with async_generation: true" in err[0], err


def test_replay_is_off_by_default_and_a_component_only_when_on():
    from maxent_grpo.train.components import plan_components

    assert grpo().replay_share == 0.0
    assert "replay" not in [c.name for c in plan_components(grpo(), "grpo")]
    on = grpo(per_device_train_batch_size=8, replay_share=0.5)
    assert "replay" in [c.name for c in plan_components(on, "grpo")]


# ---- real CPU runs --------------------------------------------------------------------------


@pytest.mark.integration
def test_a_replayed_group_carries_the_logprobs_of_the_policy_that_made_it(tmp_path, tiny_model):
    from maxent_grpo.recipe import build_recipe, read_recipe
    from maxent_grpo.train.entry import _build_trainer
    from maxent_grpo.train_process import trainer_class

    path = small_recipe(tmp_path, tiny_model, **REPLAY, max_steps=3)
    recipe = build_recipe(read_recipe(["--config", str(path)]), 1)
    trainer = _build_trainer(recipe, trainer_class(recipe.method))
    loss, logps = (
        trainer._chains["_compute_loss"],
        trainer._chains["_get_per_token_logps_and_entropies"],
    )
    now = {}
    rows = []  # (step, key, old logps, the training policy's logps) of each trained row

    def own_logps(*args, **kwargs):
        out = logps(*args, **kwargs)
        if kwargs.get("compute_entropy"):  # the loss's forward pass: the policy training now
            now["logps"] = out[0].detach()
        return out

    def own_loss(model, inputs):
        value = loss(model, inputs)
        step, mask = trainer.state.global_step + 1, inputs["completion_mask"].bool()
        for i, row in enumerate(mask):
            key = (
                tuple(inputs["prompt_ids"][i][inputs["prompt_mask"][i].bool()].tolist()),
                tuple(inputs["completion_ids"][i][row].tolist()),
            )
            rows.append((step, key, inputs["old_per_token_logps"][i][row], now["logps"][i][row]))
        return value

    trainer._chains["_compute_loss"] = own_loss
    trainer._chains["_get_per_token_logps_and_entropies"] = own_logps
    trainer.train()

    first_seen: dict[tuple, tuple] = {}
    replayed = 0
    for step, key, old, current in rows:
        if key not in first_seen:  # a fresh row: made by the policy training on it
            first_seen[key] = (step, old)
            assert (current - old).abs().max() < 1e-4, step
            continue
        made, old_then = first_seen[key]
        assert step > made
        replayed += 1
        # The logprobs of the policy that made it, kept; the ratio to today's is not 1.
        assert torch.equal(old, old_then), (step, made)
        assert (current - old).abs().max() > 1e-3, (step, made)
    assert replayed == 2 * 4, "steps 2 and 3 should each replay one group of 4"


# weight 0: stops the run at the end of a given step, as a Slurm time limit would
STOP = "tests.helpers.stop_rewards:stop_at_step"


def _launch(folder: Path, tiny_model: Path, stop_at: int = 0) -> str:
    """`maxent-grpo run` of 4 steps on 2 CPU processes (each its own buffer); with `stop_at`,
    stopped at the end of that step (its checkpoint). The launcher's output."""
    keys = {**REPLAY, "reward_funcs": ["digit_fraction", STOP], "reward_weights": [1.0, 0.0]}
    recipe = small_recipe(folder, tiny_model, **keys, max_steps=4, save_total_limit=None)
    command = [MAXENT_GRPO, "run", "--config", str(recipe), "--logs-dir", str(folder / "logs")]
    stop = dict(
        MAXENT_GRPO_TEST_STOP_AT=str(stop_at), MAXENT_GRPO_TEST_STOP_DIR=str(folder / "out")
    )
    result = run(command, timeout=600, **(stop if stop_at else {}))
    output = result.stdout + result.stderr
    assert "training: 2 processes on 1 machine(s)" in result.stdout, output[-3000:]
    assert (result.returncode != 0) == bool(stop_at), output[-3000:]
    return output


def _step_metrics(output_dir: Path) -> dict[int, dict]:
    """Each step's metrics from events.jsonl (the last attempt's, where steps repeat)."""
    return {
        int(e["step"]): e["metrics"]
        for e in read_events(output_dir)
        if e["event"] == "step" and "loss" in e.get("metrics", {})
    }


@pytest.mark.integration
def test_replay_shows_in_events_and_a_resume_keeps_the_buffer(tmp_path, tiny_model):
    """Stopped at step 2 and resumed: the events of steps 1-4 are those of a run that kept
    its buffer (a resume without it replays nothing at step 3: share 0, buffer 2). The loss
    and data of a resume against an uninterrupted run: test_state_registry.py, every piece."""
    part = tmp_path / "part" / "out"
    _launch(tmp_path / "part", tiny_model, stop_at=2)
    for process in (0, 1):  # each process's own buffer: step 1's 2 groups and step 2's 1
        saved = torch.load(part / "checkpoint-2" / STATE_FILE.format(process), weights_only=True)
        assert len(saved["pieces"]["replay"]["groups"]) == 3
    before = event_count(part)
    log = _launch(tmp_path / "part", tiny_model)
    assert_resumed_from(part, before, checkpoint=2, max_steps=4)
    steps = _step_metrics(part)  # steps 1-2 of the first attempt, 3-4 of the resumed one
    # summed over the 2 processes: 2 groups each per step, one replayed from step 2 on
    assert [steps[s]["replay/share"] for s in (1, 2, 3, 4)] == [0.0, 0.5, 0.5, 0.5], steps
    assert all(steps[s]["replay/mean_age"] >= 1 for s in (2, 3, 4)), steps
    assert [steps[s]["replay/buffer"] for s in (1, 2, 3, 4)] == [4, 6, 8, 10], steps
    assert "replay: resumed a buffer of 3 groups" in log


@pytest.mark.integration
def test_the_replay_benchmark_prints_its_figures_and_ratios(tmp_path):
    output = tmp_path / "replay.json"
    command = [PYTHON, "bench/bench_replay.py", "--steps", "3", "--rounds", "1"]
    result = run([*command, "--output", str(output)], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = {f["name"]: f for f in json.loads(output.read_text())["figures"]}
    for name in ("plain", "replay", "replay / plain"):
        assert f"{name}: informative_groups_per_step" in figures, sorted(figures)
    assert figures["replay / plain: informative_groups_per_step"]["unit"] == "x"
    assert "replay / plain: reward_at_budget" in result.stdout
