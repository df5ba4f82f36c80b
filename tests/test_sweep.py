"""`maxent-grpo sweep` (launch/sweep.py): the grid, the points, their check, the array command,
and the point each array task picks. The real array on Slurm: tests/slurm/test_sweep_slurm.py.

The `sbatch` here is a script on PATH that records its arguments (Slurm's own runs in the
slurm suite): what is tested is whether and what the command queues.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers.paths import SMOKE
from maxent_grpo import cli
from maxent_grpo.errors import UserError
from maxent_grpo.launch.attempt import declared_output_dir
from maxent_grpo.launch.launcher import RunRequest
from maxent_grpo.launch.slurm import SWEEP_ENV, slurm_job, user_error_marker
from maxent_grpo.launch.sweep import (
    make_points,
    parse_grid,
    plan_sweep,
    point_request,
    point_run,
    read_points,
)


def fake_sbatch(tmp_path: Path, monkeypatch) -> Path:
    """An `sbatch` on PATH that records its arguments and answers job 7."""
    called = tmp_path / "sbatch-called"
    script = tmp_path / "bin" / "sbatch"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\necho "$@" > {called}\necho 7\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return called


def test_grid_reads_lists_and_single_values():
    grid = parse_grid("learning_rate=[1e-6, 3e-6] maxent_tau=[0.5,1.0] seed=3")
    assert grid == {
        "learning_rate": ["1e-6", "3e-6"],
        "maxent_tau": ["0.5", "1.0"],
        "seed": ["3"],
    }


@pytest.mark.parametrize(
    "text, says",
    [
        ("learning_rate=[1e-6", "cannot read 'learning_rate=[1e-6'"),
        ("learning_rate", "cannot read 'learning_rate'"),
        ("lr=[1,] ", "has an empty value"),
        ("seed=[1] seed=[2]", "key 'seed' appears twice"),
        ("seed=[1,1]", "repeats a value"),
        ("  ", "--grid is empty"),
    ],
)
def test_bad_grid_is_one_line(text, says):
    with pytest.raises(UserError) as exc:
        parse_grid(text)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_points_are_every_combination_named_by_their_values(tmp_path):
    grid = parse_grid("learning_rate=[1e-6,3e-6] maxent_tau=[0.5,1/2]")
    points = make_points(grid, "s", tmp_path)
    assert [p.name for p in points] == [
        "s-learning_rate=1e-6-maxent_tau=0.5",
        "s-learning_rate=1e-6-maxent_tau=1_2",  # '/' cannot be in a directory name
        "s-learning_rate=3e-6-maxent_tau=0.5",
        "s-learning_rate=3e-6-maxent_tau=1_2",
    ]
    assert points[1].values == {"learning_rate": "1e-6", "maxent_tau": "1/2"}
    assert points[1].flags == (
        "--learning_rate=1e-6",
        "--maxent_tau=1/2",
        f"--output_dir={tmp_path}/{points[1].name}",
        f"--run_name={points[1].name}",
    )


def test_dry_run_lists_two_points_and_queues_nothing(tmp_path, monkeypatch, capsys):
    """The issue's must-show: the smoke recipe, two learning rates."""
    called = fake_sbatch(tmp_path, monkeypatch)
    argv = ["sweep", "--config", str(SMOKE), "--grid", "learning_rate=[1e-5,3e-5]", "--dry-run"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "sweep smoke-grpo: 2 point(s), all checked" in out
    assert "  0  smoke-grpo-learning_rate=1e-5  learning_rate=1e-5" in out
    assert "  1  smoke-grpo-learning_rate=3e-5  learning_rate=3e-5" in out
    assert "--array=0-1 " in out
    assert not called.exists()
    assert not Path("outputs/smoke-grpo.sweep.json").exists()


def test_bad_values_one_line_per_problem_nothing_queued(tmp_path, monkeypatch, capsys):
    """Every point is checked before anything is queued; a line found in several points is
    printed once, naming them."""
    called = fake_sbatch(tmp_path, monkeypatch)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(SMOKE.read_text() + f"\noutput_dir: {tmp_path}/out\n")
    grid = "learning_rate=[1e-5,-3e-5] num_generations=[8,3]"
    assert cli.main(["sweep", "--config", str(recipe), "--gpus", "1", "--grid", grid]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3, err
    lr_line = next(line for line in err if "-3e-05 is invalid" in line)
    points = [f"out-learning_rate=-3e-5-num_generations={n}" for n in (8, 3)]
    assert lr_line.endswith(f"(points {', '.join(points)})")
    assert any("not divisible by num_generations (3)" in line for line in err)
    assert err[-1] == f"2 problems in the sweep of {recipe}"
    assert not called.exists()
    assert not list(tmp_path.glob("*.sweep.json"))


def test_sweep_queues_one_throttled_array_and_writes_the_points(tmp_path, monkeypatch, capsys):
    called = fake_sbatch(tmp_path, monkeypatch)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(SMOKE.read_text() + f"\noutput_dir: {tmp_path}/out\n")
    argv = ["sweep", "--config", str(recipe), "--gpus", "1", "--throttle", "2", "--name", "lr"]
    argv += ["--grid", "learning_rate=[1e-5,3e-5] seed=[1,2,3]", "--", "--max_steps", "3"]
    assert cli.main(argv) == 0
    points_file = tmp_path / "lr.sweep.json"
    assert f"submitted array job 7 (6 tasks); points: {points_file}" in capsys.readouterr().out
    sent = called.read_text().split()
    assert "--array=0-5%2" in sent and "--job-name=maxent-grpo-sweep:lr" in sent
    assert f"--comment={points_file}" in sent  # where runs/queue.py finds the points
    tail = sent[sent.index("training.sh") :]
    assert tail[-5:] == ["--sweep-points", str(points_file), "--", "--max_steps", "3"]
    sweep, points = read_points(points_file)
    assert sweep == "lr" and len(points) == 6
    assert points[5].output_dir == f"{tmp_path}/lr-learning_rate=3e-5-seed=3"


def test_each_array_task_runs_its_own_point(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(SMOKE.read_text() + f"\noutput_dir: {tmp_path}/out\n")
    from maxent_grpo.launch.sweep import write_sweep

    request = RunRequest(recipe=str(recipe), overrides=("--max_steps", "3"))
    points = make_points(parse_grid("seed=[1,2]"), "s", tmp_path)
    path = tmp_path / "s.sweep.json"
    write_sweep(path, "s", request, {"seed": ["1", "2"]}, points)
    environ = {"SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "8"}
    picked = point_request(request, str(path), environ)
    assert picked.overrides == ("--max_steps", "3", *points[1].flags)
    assert environ[SWEEP_ENV] == "s:1"
    with pytest.raises(UserError, match="SLURM_ARRAY_TASK_ID is 2, not one of the 2 points"):
        point_request(request, str(path), {"SLURM_ARRAY_TASK_ID": "2"})


def test_a_sweep_task_remembers_a_user_error_for_its_point_only(tmp_path):
    """A retry array's tasks are attempts of one run; a sweep's tasks are runs of their own:
    one point's user error must not stop the others, and its attempt count is its restarts."""
    environ = {"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "8", "SLURM_ARRAY_TASK_ID": "3"}
    retries = slurm_job(environ)
    assert user_error_marker(tmp_path, retries) == tmp_path / ".array_8_user_error"
    assert retries.attempt == 3
    sweep = slurm_job({**environ, SWEEP_ENV: "s:3", "SLURM_RESTART_COUNT": "1"})
    assert user_error_marker(tmp_path, sweep) == tmp_path / ".array_8_3_user_error"
    assert sweep.attempt == 1


def test_points_file_that_cannot_be_read_is_one_line(tmp_path):
    (tmp_path / "bad.sweep.json").write_text(json.dumps({"points": "x"}))
    with pytest.raises(UserError, match="cannot read the sweep's points"):
        read_points(tmp_path / "bad.sweep.json")


def test_a_point_writes_to_its_own_directory_whatever_the_sweep_overrides(tmp_path):
    """--output_dir / --run_name after -- name the sweep (its parent directory), not a point."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(SMOKE.read_text())
    request = RunRequest(
        recipe=str(recipe),
        overrides=("--output_dir", f"{tmp_path}/base", "--seed", "3", "--run_name=x"),
    )
    sweep, points = plan_sweep(request, parse_grid("seed=[1]"), None)
    assert sweep == "base" and points[0].output_dir == f"{tmp_path}/base-seed=1"
    picked = point_run(request, points[0])
    assert picked.overrides == ("--seed", "3", *points[0].flags)
    assert declared_output_dir(picked) == Path(points[0].output_dir)


def test_sbatch_names_the_job_after_its_run(tmp_path, monkeypatch):
    """`maxent-grpo runs` finds a queued job by this name (runs/queue.py)."""
    called = fake_sbatch(tmp_path, monkeypatch)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(SMOKE.read_text() + f"\noutput_dir: {tmp_path}/named\n")
    assert cli.main(["sbatch", "--config", str(recipe), "--gpus", "1"]) == 0
    assert "--job-name=maxent-grpo:named" in called.read_text().split()
    assert cli.main(["sbatch", "--config", str(recipe), "--gpus", "1", "--run-name", "r2"]) == 0
    assert "--job-name=maxent-grpo:r2" in called.read_text().split()
