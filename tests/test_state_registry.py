"""The trainer-state registry (train/state.py): every registered piece is saved in each
checkpoint and restored on resume, for any process count.

The unit tests use the registry alone. The integration tests train for real with 2 CPU
processes through the launcher (`maxent-grpo run`, gloo): an uninterrupted run, a run stopped
at its checkpoint and resumed, and a resume from a copy of that checkpoint whose registered
pieces were changed, which must show in the resumed steps (a piece that was not loaded would
leave them as they were).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers.paths import MAXENT_GRPO, SMOKE_MAXENT
from helpers.recipes import recipe_data, small_recipe
from helpers.resume import assert_resumed_from, event_count, mark_tampered
from helpers.runs import run
from maxent_grpo.errors import UserError
from maxent_grpo.rundir.checkpoints import last_complete_checkpoint
from maxent_grpo.rundir.events import read_events
from maxent_grpo.train.state import STATE_FILE, StateRegistry

# ---- the registry alone ---------------------------------------------------------------------


class Counter:
    def __init__(self, value: float = 0.0):
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


def registry_of(**pieces: Counter) -> StateRegistry:
    registry = StateRegistry()
    for name, piece in pieces.items():
        registry.register(name, piece.state_dict, piece.load_state_dict, per_process=name == "mine")
    return registry


def test_every_registered_piece_round_trips(tmp_path):
    shared, mine = Counter(0.25), Counter(7.0)
    for process in (0, 1):
        mine.value = 7.0 + process
        registry_of(shared=shared, mine=mine).save(tmp_path, process, processes=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        STATE_FILE.format(0),
        STATE_FILE.format(1),
    ]
    for process in (0, 1):
        loaded_shared, loaded_mine = Counter(), Counter()
        registry_of(shared=loaded_shared, mine=loaded_mine).load(tmp_path, process, processes=2)
        assert (loaded_shared.value, loaded_mine.value) == (0.25, 7.0 + process)


def test_a_piece_the_checkpoint_lacks_is_an_error_naming_it(tmp_path):
    registry_of(shared=Counter(1.0)).save(tmp_path, 0, processes=1)
    with pytest.raises(UserError, match="no saved trainer state 'extra'"):
        registry_of(shared=Counter(), extra=Counter()).load(tmp_path, 0, processes=1)


def test_no_state_file_is_an_error_not_a_fresh_start(tmp_path):
    with pytest.raises(UserError, match=r"no registered_state-0\.pt"):
        registry_of(shared=Counter()).load(tmp_path, 0, processes=1)


def test_per_process_state_needs_the_process_count_it_was_saved_with(tmp_path):
    registry_of(shared=Counter(3.0), mine=Counter(1.0)).save(tmp_path, 0, processes=1)
    # Shared pieces load on more processes (from process 0's file)...
    shared = Counter()
    registry_of(shared=shared).load(tmp_path, 1, processes=2)
    assert shared.value == 3.0
    # ...per-process ones refuse.
    with pytest.raises(UserError, match="saved by 1 processes and this run has 2"):
        registry_of(shared=Counter(), mine=Counter()).load(tmp_path, 1, processes=2)


def test_a_piece_that_does_not_load_is_an_error_naming_it(tmp_path):
    registry_of(shared=Counter(1.0)).save(tmp_path, 0, processes=1)
    path = tmp_path / STATE_FILE.format(0)
    saved = torch.load(path, weights_only=True)
    saved["pieces"]["shared"] = {"other": 1}
    torch.save(saved, path)
    with pytest.raises(UserError, match="trainer state 'shared' does not load"):
        registry_of(shared=Counter()).load(tmp_path, 0, processes=1)


def test_a_name_registers_once_and_nothing_registered_writes_nothing(tmp_path):
    registry = registry_of(shared=Counter())
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("shared", dict, lambda state: None)
    assert StateRegistry().save(tmp_path, 0, processes=1) is None
    assert not list(tmp_path.iterdir())


# ---- real 2-process runs, stopped and resumed -------------------------------------------------


STOP = "tests.helpers.stop_rewards:stop_at_step"  # weight 0: stops the run at a given step


def launch(folder: Path, recipe: Path, stop_at: int = 0) -> str:
    """`maxent-grpo run` (2 CPU processes here); its output. With `stop_at`, the run is
    stopped at the end of that step as a Slurm time limit would stop it (the stop file)."""
    cmd = [MAXENT_GRPO, "run", "--config", str(recipe), "--logs-dir", str(folder / "logs")]
    stop = dict(
        MAXENT_GRPO_TEST_STOP_AT=str(stop_at), MAXENT_GRPO_TEST_STOP_DIR=str(folder / "out")
    )
    result = run(cmd, timeout=600, **(stop if stop_at else {}))
    output = result.stdout + result.stderr
    assert "training: 2 processes on 1 machine(s)" in result.stdout, output[-3000:]
    assert (result.returncode != 0) == bool(stop_at), output[-3000:]
    return output


def stopped_and_resumed(tmp_path: Path, make_recipe, stop_at: int, steps: int):
    """An uninterrupted run, and one stopped after step `stop_at` (its checkpoint), with a
    copy of that checkpoint; the stopped run is then resumed. Returns the three output folders
    and the registered state files of the copy, for tampering."""
    full, part, tampered = (tmp_path / name for name in ("full", "part", "tampered"))
    launch(full, make_recipe(full))
    launch(part, make_recipe(part), stop_at=stop_at)
    out = part / "out"
    assert last_complete_checkpoint(out) == out / f"checkpoint-{stop_at}"
    # one job of 2 processes (each saves its RNG), not 2 runs writing one checkpoint
    assert (out / f"checkpoint-{stop_at}" / "rng_state_1.pth").is_file()
    shutil.copytree(part, tampered, ignore=shutil.ignore_patterns("logs"))
    before = event_count(out)
    log = launch(part, make_recipe(part))
    assert_resumed_from(out, before, checkpoint=stop_at, max_steps=steps)
    assert "Restored trainer state" in log
    files = [tampered / "out" / f"checkpoint-{stop_at}" / STATE_FILE.format(i) for i in (0, 1)]
    assert all(f.is_file() for f in files)
    return full / "out", out, tampered, files


def resume_tampered(tampered: Path, make_recipe, files: list[Path], change, stop_at, steps):
    for path in files:
        saved = torch.load(path, weights_only=True)
        change(saved["pieces"])
        torch.save(saved, path)
    mark_tampered(files[0].parent)
    before = event_count(tampered / "out")
    launch(tampered, make_recipe(tampered))
    assert_resumed_from(tampered / "out", before, checkpoint=stop_at, max_steps=steps)
    return step_metrics(tampered / "out")


def step_metrics(output_dir: Path) -> dict[int, dict]:
    """Each step's metrics from events.jsonl (the last attempt's, where steps repeat)."""
    found: dict[int, dict] = {}
    for event in read_events(output_dir):
        if event["event"] == "step" and "loss" in event.get("metrics", {}):
            found[int(event["step"])] = event["metrics"]
    return found


def same_weights(a: Path, b: Path) -> None:
    weights_a, weights_b = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert weights_a.keys() == weights_b.keys()
    for name, tensor in weights_a.items():
        assert torch.equal(tensor, weights_b[name]), name


def same_steps(expected: dict, resumed: dict, steps) -> None:
    for step in steps:
        a = {k: v for k, v in expected[step].items() if "time" not in k and "runtime" not in k}
        b = {k: v for k, v in resumed[step].items() if "time" not in k and "runtime" not in k}
        assert a == b, f"step {step} differs after resume"


MAXENT_REWARDS = recipe_data(Path("."), SMOKE_MAXENT)

# GRPO with an adaptive beta and rollout rounds: oversampling carries surplus groups over,
# so both registered pieces (`kl_controller`, `rollouts`) hold state at the checkpoint.
GRPO_KEYS = dict(
    use_cpu=None,  # unset: 2 processes without CUDA must still train as one job
    reward_funcs=["digit_fraction", STOP],
    reward_weights=[1.0, 0.0],
    num_generations=4,
    per_device_train_batch_size=4,
    max_completion_length=16,
    learning_rate=1.0e-2,
    init_kl_coeff=0.05,
    kl_target=0.002,
    kl_horizon=8,
    rollout_filters=["nonzero_std"],
    max_generation_rounds=2,
    oversample_factor=2.0,
    max_steps=5,
    save_steps=1000,
    save_total_limit=None,
)


@pytest.mark.integration
def test_grpo_two_processes_resume_every_registered_piece(tmp_path, tiny_model):
    def recipe(folder: Path) -> Path:
        return small_recipe(folder, tiny_model, **GRPO_KEYS)

    full, part, tampered, files = stopped_and_resumed(tmp_path, recipe, stop_at=3, steps=5)
    expected, resumed = step_metrics(full), step_metrics(part)
    same_steps(expected, resumed, (4, 5))
    same_weights(full, part)
    saved = [torch.load(f, weights_only=True)["pieces"] for f in files]
    assert sorted(saved[0]) == ["kl_controller", "rollouts"]
    # What step 4 ran with is the saved state, and it has moved from its start.
    assert saved[0]["kl_controller"]["beta"] == expected[4]["beta"] != expected[1]["beta"]
    carried = [len(s["rollouts"]["carried"]) for s in saved]
    assert sum(carried) > 0, "the test needs groups carried over at the checkpoint"
    assert resumed[4]["rollouts/carried_in"] == expected[4]["rollouts/carried_in"] > 0

    def change(pieces: dict) -> None:
        pieces["kl_controller"]["beta"] = 0.123
        pieces["rollouts"]["carried"] = []

    changed = resume_tampered(tampered, recipe, files, change, stop_at=3, steps=5)
    assert changed[4]["beta"] == 0.123
    assert changed[4]["rollouts/carried_in"] == 0


@pytest.mark.integration
def test_maxent_two_processes_resume_the_controllers(tmp_path, tiny_model):
    """The run this broke in: a 2-process MaxEnt run resumed with tau and beta at their
    initial values (the multi-process CPU optimizer load returned before they were read)."""

    def recipe(folder: Path) -> Path:
        return small_recipe(
            folder,
            tiny_model,
            SMOKE_MAXENT,
            reward_funcs=[*MAXENT_REWARDS["reward_funcs"], STOP],
            reward_weights=[*MAXENT_REWARDS["reward_weights"], 0.0],
            max_steps=5,
            save_steps=1000,
            save_total_limit=None,
            per_device_train_batch_size=4,
        )

    full, part, tampered, files = stopped_and_resumed(tmp_path, recipe, stop_at=3, steps=5)
    expected, resumed = step_metrics(full), step_metrics(part)
    same_steps(expected, resumed, (4, 5))
    same_weights(full, part)
    saved = torch.load(files[1], weights_only=True)["pieces"]
    assert sorted(saved) == ["maxent_controllers"]
    state = saved["maxent_controllers"]
    assert state["tau"]["tau"] == expected[4]["maxent/tau"] != expected[1]["maxent/tau"]
    assert state["kl"]["beta"] == expected[4]["maxent/beta"] != expected[1]["maxent/beta"]

    def change(pieces: dict) -> None:
        pieces["maxent_controllers"]["kl"]["beta"] = 0.0123
        pieces["maxent_controllers"]["tau"]["tau"] = 0.456

    changed = resume_tampered(tampered, recipe, files, change, stop_at=3, steps=5)
    assert (changed[4]["maxent/beta"], changed[4]["maxent/tau"]) == (0.0123, 0.456)
