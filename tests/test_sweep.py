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

from helpers.paths import REPO, SMOKE
from maxent_grpo import cli
from maxent_grpo.errors import ConfigProblems, UserError
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
from maxent_grpo.recipe.parser import read_recipe

QWEN = REPO / "recipes" / "Qwen2.5-1.5B-Instruct" / "grpo" / "config_math.yaml"


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


# --------------------------------------------------------------------------- the sweep: section


def sweep_recipe(tmp_path: Path, section: str) -> Path:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(SMOKE.read_text() + f"\noutput_dir: {tmp_path}/out\nsweep: {section}\n")
    return recipe


def test_sweep_section_is_the_grid_without_grid_flag(tmp_path, monkeypatch, capsys):
    """No --grid: the recipe's grid, throttle and name; YAML scalars as flag text."""
    called = fake_sbatch(tmp_path, monkeypatch)
    section = "{grid: {learning_rate: [1.0e-5, 3.0e-5], use_cpu: [true]}, throttle: 2, name: s}"
    recipe = sweep_recipe(tmp_path, section)
    assert cli.main(["sweep", "--config", str(recipe), "--gpus", "1"]) == 0
    sent = called.read_text().split()
    assert "--array=0-1%2" in sent and "--job-name=maxent-grpo-sweep:s" in sent
    sweep, points = read_points(tmp_path / "s.sweep.json")
    assert [p.values for p in points] == [
        {"learning_rate": "1e-05", "use_cpu": "true"},
        {"learning_rate": "3e-05", "use_cpu": "true"},
    ]
    assert "sweep s: 2 point(s), all checked" in capsys.readouterr().out


def test_grid_flag_merges_with_the_section_key_by_key(tmp_path, monkeypatch, capsys):
    """A --grid key replaces the section's values of that key (one value pins it); the
    section's other keys stay; --throttle and --name win over the section's."""
    fake_sbatch(tmp_path, monkeypatch)
    recipe = sweep_recipe(
        tmp_path, "{grid: {learning_rate: [1e-5, 3e-5], seed: [1, 2]}, throttle: 4}"
    )
    argv = ["sweep", "--config", str(recipe), "--gpus", "1", "--dry-run", "--throttle", "1"]
    assert cli.main([*argv, "--grid", "seed=7 beta=[0.0,0.1]"]) == 0
    out = capsys.readouterr().out
    assert "sweep out: 4 point(s)" in out and "--array=0-3%1 " in out
    assert "  3  out-learning_rate=3e-5-seed=7-beta=0.1  " in out


def test_bad_sweep_section_one_line_per_problem(tmp_path, monkeypatch, capsys):
    """`check` reads the section (read_recipe) and `sweep` refuses it before any point."""
    called = fake_sbatch(tmp_path, monkeypatch)
    section = (
        "{grid: {learning_rat: [1e-5], learning_rate: [-1, abc], output_dir: [x], seed: [1, null]},"
        " throttle: 0, nmae: x}"
    )
    recipe = sweep_recipe(tmp_path, section)
    with pytest.raises(ConfigProblems) as exc:
        read_recipe(["--config", str(recipe)])
    where = f"{recipe}: sweep:"
    assert sorted(exc.value.problems) == sorted(
        [
            f"{where} unknown key 'nmae'; did you mean 'name'?",
            f"{where} grid key 'output_dir': each point sets its own; drop it",
            f"{where} grid key 'seed': [1, None] is not a list of values (none empty, null or "
            "nested); write seed: [a, b]",
            f"{where} throttle: 0 is invalid; give an integer >= 1",
            f"{where} grid unknown key 'learning_rat'; did you mean 'learning_rate'?",
            f"{where} grid key 'learning_rate': '-1' is invalid (must be >= 0)",
            f"{where} grid key 'learning_rate': 'abc' is invalid (argument "
            "--learning_rate/--learning-rate: invalid float value: 'abc')",
        ]
    )
    assert cli.main(["sweep", "--config", str(recipe), "--gpus", "1"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"7 problems in {recipe}"
    assert not called.exists()


def test_training_parser_never_sees_the_sweep_section(tmp_path):
    """The trainers read the recipe with read_recipe: TRL's own parser of the sections gets
    the same values as without the section (a key it does not know would raise)."""
    from maxent_grpo.recipe.schema import trl_parser
    from maxent_grpo.recipe.sections import SECTIONS

    recipe = sweep_recipe(tmp_path, "{grid: {seed: [1, 2]}}")
    plain = tmp_path / "plain.yaml"
    plain.write_text(SMOKE.read_text() + f"\noutput_dir: {tmp_path}/out\n")
    ours = read_recipe(["--config", str(recipe)], parser_for=lambda m: trl_parser(SECTIONS[m]))
    assert ours.sweep.grid == {"seed": ["1", "2"]} and "sweep" not in ours.values
    assert ours.values == read_recipe(["--config", str(plain)]).values


def test_nothing_to_sweep_is_one_line(tmp_path, monkeypatch, capsys):
    fake_sbatch(tmp_path, monkeypatch)
    assert cli.main(["sweep", "--config", str(SMOKE), "--dry-run"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"error: {SMOKE}: nothing to sweep: no --grid and no sweep: section; give --grid "
        "'key=[a,b]' or add sweep: {grid: {key: [a, b]}} to the recipe"
    ]


@pytest.mark.parametrize(("nodes", "no_kill"), [("[2]", True), ("[1,2]", False)])
def test_an_array_outlives_a_failed_node_only_when_every_point_has_several_servers(
    tmp_path, monkeypatch, capsys, nodes, no_kill
):
    """--no-kill is the array's, for all its tasks: only when each point's plan has a vLLM
    server on several nodes (a one-server run is ended and requeued by Slurm)."""
    fake_sbatch(tmp_path, monkeypatch)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(QWEN.read_text() + f"\noutput_dir: {tmp_path}/out\n")
    argv = ["sweep", "--config", str(recipe), "--gpus", "8", "--nodes", "4", "--dry-run"]
    assert cli.main([*argv, "--grid", f"vllm_nodes={nodes}"]) == 0, capsys.readouterr().err
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("dry run:")]
    assert ("--no-kill" in line.split()) == no_kill


def test_grid_flag_refuses_where_each_point_writes(tmp_path, monkeypatch, capsys):
    """--grid refuses output_dir as the sweep: section does (each point sets its own)."""
    called = fake_sbatch(tmp_path, monkeypatch)
    argv = ["sweep", "--config", str(SMOKE), "--grid", "output_dir=[a,b]", "--dry-run"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --grid key 'output_dir': each point sets its own; drop it"], err
    assert not called.exists()


def test_a_cpu_recipe_asks_slurm_for_no_gpu(tmp_path, monkeypatch, capsys):
    """A use_cpu recipe (CPU training, no vLLM on a GPU): --gres=none, not the --gpus default
    (training.sh's header asks for 8); a recipe whose server runs on a GPU keeps --gres=gpu:N."""
    fake_sbatch(tmp_path, monkeypatch)
    argv = ["sweep", "--config", str(SMOKE), "--grid", "seed=[1]", "--dry-run"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert " --gres=none " in out and "--gres=gpu" not in out, out
    from maxent_grpo.launch.launcher import prepare
    from maxent_grpo.launch.sbatch import fit_gpu_request, planned_environment

    gpu_server = ("--use_vllm", "true", "--vllm_mode", "server", "--use_cpu", "false")
    request = RunRequest(recipe=str(SMOKE), overrides=gpu_server)
    prepared = prepare(request, environment=planned_environment(1, 2), packages=False)
    command = ["sbatch", "--gres=gpu:2", "training.sh"]
    fit_gpu_request(command, prepared)
    assert command == ["sbatch", "--gres=gpu:2", "training.sh"]
