"""A new user's first day (issue 26): a resume keeps the settings a run started with.

The trap: `training.sh -- --max_steps 200`, stopped at step 51, then `training.sh` again
resumed with the recipe's max_steps (below 51) and marked the run complete at step 51.
Replayed here with the tiny model: started with `-- --max_steps 4`, stopped at step 2, the
recipe itself says max_steps 1.
"""

from __future__ import annotations

import json
import os
import subprocess
from types import SimpleNamespace

import pytest

from helpers.paths import MAXENT_GRPO, PYTHON, REPO
from helpers.recipes import small_recipe
from helpers.resume import assert_resumed_from, event_count
from helpers.runs import child_env, run
from maxent_grpo.errors import ConfigProblems, UserError
from maxent_grpo.launch.launcher import RunRequest, prepare
from maxent_grpo.launch.resume import changed_keys, changes_training
from maxent_grpo.preflight import check_recipe
from maxent_grpo.recipe import build_recipe, read_recipe
from maxent_grpo.rundir.checkpoints import last_complete_checkpoint, run_is_complete
from maxent_grpo.rundir.settings import RunSettings, read_settings

STOP = "tests.helpers.stop_rewards:stop_at_step"


def _launch(recipe, *args, **env):
    logs = ["--logs-dir", os.path.join(os.path.dirname(recipe), "logs")]  # not the checkout's
    return run([MAXENT_GRPO, "run", "--config", str(recipe), *logs, *args], **env)


def test_a_resume_keeps_the_settings_the_run_started_with(tmp_path, tiny_model):
    recipe = small_recipe(
        tmp_path,
        tiny_model,
        max_steps=1,
        reward_funcs=["digit_fraction", STOP],
        reward_weights=[1.0, 0.0],
        env={"OMP_NUM_THREADS": "1"},
        # One trainer: what is checked is which settings a resume takes, not how many
        # processes train (2-process resumes: test_state_registry.py); a trainer's start is
        # ~8 CPU-s of imports per launch.
        num_processes=1,
    )
    out = tmp_path / "out"
    stop = dict(MAXENT_GRPO_TEST_STOP_AT="2", MAXENT_GRPO_TEST_STOP_DIR=str(out))
    first = _launch(recipe, "--", "--max_steps", "4", **stop)
    assert last_complete_checkpoint(out) == out / "checkpoint-2", first.stdout[-3000:]
    settings = read_settings(out)
    assert settings.overrides == ("--max_steps", "4") and settings.values["max_steps"] == 4

    # The trap's second command: the same recipe without the overrides resumes towards 4.
    before = event_count(out)
    second = _launch(recipe)
    log = second.stdout + second.stderr
    assert second.returncode == 0, log[-3000:]
    assert "started with -- --max_steps 4" in log
    assert_resumed_from(out, before, 2, max_steps=4, log=log)
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4

    # Another value of a key that changes training: one line naming it and both values.
    lower = _launch(recipe, "--", "--max_steps", "3")
    assert lower.returncode == 2
    error = lower.stderr.strip().splitlines()
    assert len(error) == 1 and "max_steps 4 -> 3" in error[0] and "--accept-changes" in error[0]
    assert "Training complete" not in lower.stdout + lower.stderr
    # Accepted, a max_steps behind the checkpoint is still refused: it would end the run.
    behind = _launch(recipe, "--accept-changes", "--", "--max_steps", "3")
    assert behind.returncode == 2 and "past max_steps 3" in behind.stderr, behind.stderr

    # A completed run given more steps: refused by default, trained on when accepted.
    assert run_is_complete(out)
    more = _launch(recipe, "--", "--max_steps", "6")
    assert more.returncode == 2 and "max_steps 4 -> 6" in more.stderr
    before = event_count(out)
    accepted = _launch(recipe, "--accept-changes", "--", "--max_steps", "6")
    log = accepted.stdout + accepted.stderr
    assert accepted.returncode == 0, log[-3000:]
    assert_resumed_from(out, before, 4, max_steps=6, log=log)
    assert run_is_complete(out) and read_settings(out).values["max_steps"] == 6


def test_where_a_run_is_logged_or_saved_does_not_change_training():
    assert changes_training("max_steps") and changes_training("learning_rate")
    for key in ("logging_steps", "save_steps", "report_to", "hang_timeout", "output_dir"):
        assert not changes_training(key)


def test_sbatch_without_slurm_is_one_line(tmp_path, tiny_model):
    recipe = small_recipe(tmp_path, tiny_model)
    # A PATH with nothing on it: no sbatch even where this machine has Slurm.
    empty = tmp_path / "bin"
    empty.mkdir()
    result = run([MAXENT_GRPO, "sbatch", "--config", str(recipe), "--gpus", "0"], PATH=str(empty))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: maxent-grpo sbatch: sbatch is not on PATH; submit from a Slurm login node "
        "(bash training.sh runs locally)"
    ]


def test_a_slurm_attempt_lists_its_gpus_in_the_jobs_log(tmp_path):
    """training.sh under Slurm writes `nvidia-smi -L` (names, UUIDs) to the job's stderr log;
    a stand-in nvidia-smi (no GPU here) and maxent-grpo (MAXENT_GRPO_ENV=current) on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {
        "nvidia-smi": 'echo "GPU 0: NVIDIA H200 (UUID: GPU-0f1e)"',
        "maxent-grpo": 'echo "launcher: $*"',
    }.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**child_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "5"}
    env["MAXENT_GRPO_ENV"] = "current"
    done = subprocess.run(
        ["bash", "training.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "launcher: run --config recipes/smoke/config_grpo.yaml" in done.stdout
    err = done.stderr.splitlines()
    assert err[0].startswith("training.sh: job 5 attempt 0") and err[1] == (
        "GPU 0: NVIDIA H200 (UUID: GPU-0f1e)"
    ), err


def test_the_entry_scripts_set_the_launchers_thread_default(tmp_path):
    # runpy with another run_name: the script's imports and defaults, no training.
    code = (
        "import os, runpy, sys; runpy.run_path(sys.argv[1], run_name='x'); "
        "print(os.environ['OMP_NUM_THREADS'])"
    )
    for script in ("src/grpo.py", "src/maxent-grpo.py"):
        env = {k: v for k, v in child_env().items() if k != "OMP_NUM_THREADS"}
        cpus = len(os.sched_getaffinity(0))
        shared = subprocess.run(
            [PYTHON, "-c", code, script],
            cwd=REPO,
            env={**env, "LOCAL_WORLD_SIZE": "2"},
            capture_output=True,
            text=True,
            check=True,
        )
        assert shared.stdout.split()[-1] == str(max(1, cpus // 2))
        kept = subprocess.run(
            [PYTHON, "-c", code, script],
            cwd=REPO,
            env={**env, "OMP_NUM_THREADS": "3"},
            capture_output=True,
            text=True,
            check=True,
        )
        assert kept.stdout.split()[-1] == "3"  # a user's own value wins


def _problems(recipe) -> list[str]:
    try:
        prepare(RunRequest(recipe=str(recipe)), packages=False)
    except ConfigProblems as exc:
        return list(exc.problems)
    except UserError as exc:
        return [str(exc)]
    return []


def test_local_data_and_reward_names_are_checked_before_launch(tmp_path, tiny_model):
    """What `check` finds in the data and rewards, the launcher finds too, in one pass and
    without loading the data (issue 26.3): the trainers never start."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "1+1", "solution": "2"}\n')
    table = tmp_path / "rows.csv"
    table.write_text("problem,solution\n1+1,2\n")
    good = small_recipe(tmp_path, tiny_model, name="good.yaml", dataset_name=str(table))
    assert _problems(good) == []
    typo = small_recipe(
        tmp_path,
        tiny_model,
        name="typo.yaml",
        dataset_name=str(rows),
        reward_funcs=["digit_fractoin"],
        reward_weights=[1.0],
    )
    found = _problems(typo)
    assert len(found) == 2, found
    assert f"dataset_name: column 'problem' not in {rows} (columns: question, solution)" in found[0]
    assert "unknown reward 'digit_fractoin'" in found[1]
    # `check` (the trainers' checks too) reports the same two, not the reward error alone.
    with pytest.raises(ConfigProblems) as checked:
        check_recipe(build_recipe(read_recipe(["--config", str(typo)]), 1))
    checked_lines = checked.value.problems
    assert len(checked_lines) == 2, checked_lines
    assert any("dataset_name: column 'problem' not in" in line for line in checked_lines)
    assert any("unknown reward 'digit_fractoin'" in line for line in checked_lines)
    mixture = {"datasets": [{"path": str(table), "columns": ["problem", "answer"]}]}
    mixed = small_recipe(
        tmp_path, tiny_model, name="mix.yaml", dataset_name=None, dataset_mixture=mixture
    )
    assert "dataset_mixture.datasets[0]: column 'answer' not in" in _problems(mixed)[0]

    # Through the command: one line, exit 2, before any process starts.
    missing = small_recipe(tmp_path, tiny_model, name="missing.yaml", dataset_name="./nope.jsonl")
    result = run([MAXENT_GRPO, "run", "--config", str(missing)])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: {missing}: dataset_name: ./nope.jsonl does not exist; fix the path "
        f"(relative to {REPO})"
    ]
    assert not (tmp_path / "out").exists()


def test_a_run_recorded_with_the_default_rewards_written_out_resumes_unchanged():
    """Runs recorded before reward_funcs' default was left unset hold [answer_match]; an
    unset value now trains with the same list unless an environment scores its rollouts."""
    recorded = RunSettings("r.yaml", "grpo", (), {"reward_funcs": ["answer_match"]})

    def now(**values):
        return SimpleNamespace(method="grpo", values={"environment": None, **values})

    assert changed_keys(recorded, now(reward_funcs=None)) == []
    assert changed_keys(recorded, now(reward_funcs=["format"])) == [
        ("reward_funcs", ["answer_match"], ["format"])
    ]
    with_environment = now(reward_funcs=None, environment="mypkg.envs:Calculator")
    assert changed_keys(recorded, with_environment) == [("reward_funcs", ["answer_match"], None)]


CONDA = r"""#!/bin/bash
# A stand-in conda (no conda channel is reachable here): `env create -p PREFIX -f FILE` makes
# PREFIX/bin with a python that runs this machine's .venv python (its `-m pip` only logged)
# and a maxent-grpo that prints its arguments.
echo "conda $*" >> "$CALLS"
[[ "$1 $2" == "env create" ]] || exit 1
prefix=$(sed -n 's/.* -p \([^ ]*\).*/\1/p' <<< "$*")
grep -q "python=3.11" "$(sed -n 's/.* -f \([^ ]*\).*/\1/p' <<< "$*")" || exit 1
mkdir -p "$prefix/bin"
cat > "$prefix/bin/python" <<END
#!/bin/bash
if [[ "\$1 \$2" == "-m pip" ]]; then echo "pip \$*" >> "$CALLS"; exit 0; fi
exec $REAL_PYTHON "\$@"
END
printf '#!/bin/bash\necho "launcher: $*"\n' > "$prefix/bin/maxent-grpo"
chmod +x "$prefix/bin/python" "$prefix/bin/maxent-grpo"
"""


def test_training_sh_in_conda_mode_makes_the_env_once_and_runs_its_launcher(tmp_path):
    """Issue 55: MAXENT_GRPO_ENV=conda (environment.yml instead of a venv) was never run. A
    copy of the bootstrap (training.sh, scripts/, environment.yml, the smoke recipes) with a
    stand-in conda: the env is made once, in the checkout's .conda-env, from environment.yml;
    a recipe's extras go into that env with its own pip; its launcher runs the recipe."""
    import shutil

    root = tmp_path / "checkout"
    root.mkdir()
    for name in ("training.sh", "environment.yml", "pyproject.toml"):
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "scripts", root / "scripts")
    shutil.copytree(REPO / "recipes" / "smoke", root / "recipes" / "smoke")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "conda").write_text(CONDA)
    (bin_dir / "conda").chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {**child_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "MAXENT_GRPO_ENV": "conda"}
    env.update(CALLS=str(calls), REAL_PYTHON=str(PYTHON))

    def training(*args):
        return subprocess.run(
            ["bash", "training.sh", *args],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    first = training()
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "launcher: run --config recipes/smoke/config_grpo.yaml"
    lora = training("--config", "recipes/smoke/config_grpo_lora.yaml")
    assert lora.returncode == 0, lora.stderr
    assert calls.read_text().splitlines() == [
        f"conda env create --quiet -p {root}/.conda-env -f environment.yml",  # once
        "pip -m pip install --quiet --disable-pip-version-check -e .[dev,peft]",
    ]
    assert lora.stdout.strip().endswith("--config recipes/smoke/config_grpo_lora.yaml")
    env["PATH"] = "/usr/bin:/bin"  # no conda
    refused = training()
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: MAXENT_GRPO_ENV=conda but conda is not on PATH; unset it to use a venv"
    )
