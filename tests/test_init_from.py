"""`init_from` (launch/init_from.py): a run starts from another run's model, resolved when the
job starts; a missing or unfinished source is one line before anything starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.paths import MAXENT_GRPO
from helpers.recipes import ONE_THREAD, small_recipe
from helpers.runs import run
from maxent_grpo import cli
from maxent_grpo.errors import ConfigError
from maxent_grpo.launch.init_from import declared_init_from, resolve, with_init
from maxent_grpo.launch.launcher import RunRequest
from maxent_grpo.rundir.checkpoints import mark_checkpoint_complete, mark_run_complete
from maxent_grpo.rundir.events import read_events


def source_run(outputs: Path, name: str = "sft", complete: bool = True) -> Path:
    run_dir = outputs / name
    (run_dir / "checkpoint-2").mkdir(parents=True)
    mark_checkpoint_complete(run_dir / "checkpoint-2", 2)
    (run_dir / "checkpoint-4").mkdir()  # a save that did not finish
    if complete:
        mark_run_complete(run_dir, {"step": 4})
    return run_dir


def test_a_run_name_dir_or_checkpoint_resolves_to_a_finished_model(tmp_path):
    outputs = tmp_path / "outputs"
    run_dir = source_run(outputs)
    assert resolve("sft", "r.yaml", outputs) == outputs / "sft"  # a run name: its final model
    assert resolve(str(run_dir), "r.yaml", outputs) == run_dir  # a run directory
    assert resolve("sft/checkpoint-2", "r.yaml", outputs) == run_dir / "checkpoint-2"


@pytest.mark.parametrize(
    "source, says",
    [
        ("nope", "names no directory"),
        ("sft/checkpoint-4", "is not a complete checkpoint"),
        ("running", "has not finished"),
    ],
)
def test_a_missing_or_unfinished_source_is_one_line(tmp_path, source, says):
    outputs = tmp_path / "outputs"
    source_run(outputs)
    source_run(outputs, "running", complete=False)
    with pytest.raises(ConfigError) as exc:
        resolve(source, "r.yaml", outputs)
    line = str(exc.value)
    assert line.startswith(f"r.yaml: key 'init_from' ('{source}')") and says in line
    assert "\n" not in line


def test_the_command_line_wins_and_the_model_path_is_replaced(tmp_path):
    source = source_run(tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("init_from: elsewhere\nmodel_name_or_path: m\n")
    assert declared_init_from(RunRequest(str(recipe))) == "elsewhere"
    request = RunRequest(str(recipe), overrides=("--init_from", str(source)))
    started, found = with_init(request)
    assert found == (str(source), source)
    assert started.overrides[-1] == f"--model_name_or_path={source}"
    assert with_init(RunRequest(str(tmp_path / "none.yaml"))) == (
        RunRequest(str(tmp_path / "none.yaml")),
        None,
    )


def test_run_refuses_a_missing_source_before_anything_starts(tmp_path, capsys):
    recipe = small_recipe(tmp_path, init_from=str(tmp_path / "not-yet"))
    assert cli.main(["run", "--config", str(recipe), "--logs-dir", str(tmp_path / "logs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "key 'init_from'" in err[0] and "names no directory" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_a_run_starts_from_its_init_from_model(tmp_path, tiny_model):
    """The one real run of issue 41: the recipe's own model_name_or_path does not exist, so
    the run can only train if it starts from init_from's (a finished "run": the tiny model)."""
    source = tmp_path / "sft"
    shutil.copytree(tiny_model, source)
    mark_run_complete(source, {"step": 0})
    recipe = small_recipe(
        tmp_path,
        **ONE_THREAD,
        model_name_or_path=str(tmp_path / "no-such-model"),
        init_from=str(source),
        max_steps=1,
    )
    result = run([MAXENT_GRPO, "run", "--config", str(recipe), "--logs-dir", str(tmp_path)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"init_from {source}: starting from {source}" in result.stdout
    out = tmp_path / "out"
    (event,) = [e for e in read_events(out) if e["event"] == "init_from"]
    assert (event["source"], event["path"]) == (str(source), str(source))
    settings = json.loads((out / "run_settings.json").read_text())
    assert settings["values"]["model_name_or_path"] == str(source)
    assert (out / "model.safetensors").is_file()
