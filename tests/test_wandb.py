"""W&B continuity with the real wandb package (offline): one run across two attempts.

The first attempt is stopped through the stop file after step 2 (what a Slurm time-limit signal
does), saves a checkpoint and exits for a requeue; the second resumes and finishes. Both log
to the W&B run whose id the first attempt persisted in output_dir, with continuous steps.
"""

from __future__ import annotations

import secrets

import pytest

from helpers.recipes import write_recipe
from helpers.runs import PYTHON, REPO, run
from helpers.wandb_files import history, run_id
from maxent_grpo.errors import EXIT_CHECKPOINTED
from maxent_grpo.recipe.needs import uses_wandb
from maxent_grpo.rundir.checkpoints import clear_stop_request, last_complete_checkpoint
from maxent_grpo.train.wandb_run import (
    RUN_ID_FILE,
    STEP_FILE,
    export_wandb_run,
    persistent_run_id,
    record_step,
    recorded_step,
)

GRPO = str(REPO / "src" / "grpo.py")


class Args:
    def __init__(self, output_dir, report_to):
        self.output_dir, self.report_to = str(output_dir), report_to


def test_the_recorded_step_is_the_last_one_written_a_shorter_one_too(tmp_path):
    assert recorded_step(tmp_path) is None
    (tmp_path / STEP_FILE).write_text("3\n")  # written by an earlier version
    for step in (12345, 7, 2**40):
        record_step(tmp_path, step)
        assert recorded_step(tmp_path) == step
    record_step(tmp_path, 8)
    assert recorded_step(tmp_path) == 8
    assert [p.name for p in tmp_path.iterdir()] == [STEP_FILE]  # in place: no temporary file


def test_run_id_is_created_once_and_then_read(tmp_path):
    first = persistent_run_id(tmp_path / "out")
    assert first.isalnum() and len(first) == 12
    assert persistent_run_id(tmp_path / "out") == first
    assert (tmp_path / "out" / RUN_ID_FILE).read_text().strip() == first
    assert [p.name for p in (tmp_path / "out").iterdir()] == [RUN_ID_FILE]  # no temp left


def test_concurrent_processes_agree_on_one_run_id(tmp_path):
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(4) as pool:
        ids = list(pool.map(persistent_run_id, [tmp_path / "out"] * 16))
    assert len(set(ids)) == 1 and ids[0] == persistent_run_id(tmp_path / "out")


def test_export_only_with_wandb_and_user_settings_win(tmp_path):
    environ: dict[str, str] = {}
    export_wandb_run(Args(tmp_path / "a", ["tensorboard"]), environ)
    assert environ == {} and not (tmp_path / "a").exists()
    assert uses_wandb(Args(tmp_path, "wandb")) and uses_wandb(Args(tmp_path, ["all"]))
    export_wandb_run(Args(tmp_path / "b", ["wandb"]), environ)
    assert environ == {
        "WANDB_RUN_ID": persistent_run_id(tmp_path / "b"),
        "WANDB_RESUME": "allow",
        "WANDB_DIR": str((tmp_path / "b").absolute()),
    }
    mine = {"WANDB_RUN_ID": "mine", "WANDB_RESUME": "must", "WANDB_DIR": "/x"}
    environ = dict(mine)
    export_wandb_run(Args(tmp_path / "c", ["wandb"]), environ)
    assert environ == mine


@pytest.mark.integration
def test_two_attempts_log_one_offline_run_with_continuous_steps(tmp_path, tiny_model):
    secret = f"some-fake-secret-{secrets.token_hex(8)}"
    out = tmp_path / "out"
    recipe = write_recipe(
        tmp_path,
        model_name_or_path=str(tiny_model),
        dataset_num_rows=128,
        max_completion_length=12,
        max_steps=4,
        save_steps=1000,  # the only checkpoint is the one the stop asks for
        reward_funcs=["digit_fraction", "tests.helpers.stop_rewards:stop_at_step"],
        reward_weights=[1.0, 0.0],
        report_to=["wandb"],
        run_name="wandb-continuity",
    )
    env = dict(
        WANDB_MODE="offline",
        WANDB_API_KEY=secret,
        MAXENT_GRPO_TEST_STOP_AT="2",
        MAXENT_GRPO_TEST_STOP_DIR=str(out),
    )
    first = run([PYTHON, GRPO, "--config", str(recipe)], **env)
    assert first.returncode == EXIT_CHECKPOINTED, first.stderr[-3000:]
    assert last_complete_checkpoint(out) == out / "checkpoint-2"
    clear_stop_request(out)  # what the launcher does before the next attempt
    second = run([PYTHON, GRPO, "--config", str(recipe)], **env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Resuming from" in second.stdout + second.stderr

    the_id = (out / RUN_ID_FILE).read_text().strip()
    # wandb ignores resume offline: one directory per attempt, both of the persisted run id.
    dirs = sorted((out / "wandb").glob("offline-run-*"))
    assert [d.name.endswith(f"-{the_id}") for d in dirs] == [True, True]
    assert [run_id(d) for d in dirs] == [the_id, the_id]
    rows = [history(d) for d in dirs]
    train_steps = [[r["train/global_step"] for r in rs if "train/loss" in r] for rs in rows]
    assert train_steps == [[1, 2], [3, 4]]
    x_axis = [r["train/global_step"] for rs in rows for r in rs]
    assert x_axis == sorted(x_axis) and x_axis[len(rows[0])] == 2  # resumed at step 2, not 0
    internal = [r["_step"] for rs in rows for r in rs]
    print(f"W&B offline: {len(internal)} history rows, _step {internal}; steps {train_steps}")
    assert internal == list(range(len(internal)))  # continuous: no restart at 0, no overlap
    assert recorded_step(out) == len(internal)

    texts = [first.stdout, first.stderr, second.stdout, second.stderr]
    files = [p for p in out.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.suffix == ".wandb" for p in files)
    assert not [t for t in texts if secret in t]
    assert not [p for p in files if secret.encode() in p.read_bytes()]
