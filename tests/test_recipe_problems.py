"""Every problem of a recipe in one run (recipe/problems.py), the migration lines of `check`,
the evaluation batch for the planned processes, and the keys open-r1 recipes bring."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers.paths import MAXENT_GRPO, REPO
from helpers.recipes import MINIMAL, write_recipe
from helpers.runs import run
from maxent_grpo.errors import ConfigProblems, error_report
from maxent_grpo.recipe import ConfigError, build_recipe, parse_recipe, read_recipe

BASE = MINIMAL


def recipe(tmp_path: Path, extra: str = "", **keys) -> str:
    path = write_recipe(tmp_path, base=None, **{**BASE, **keys})
    path.write_text(path.read_text() + extra)
    return str(path)


def problems_of(argv, **kwargs) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        parse_recipe(argv, **kwargs)
    if isinstance(info.value, ConfigProblems):
        return info.value.problems
    return (str(info.value),)


# ---- every problem in one run ------------------------------------------------------------


def test_check_reports_every_problem_then_the_count(tmp_path):
    """Every problem the schema and the launcher's checks find, in one run that imports no TRL
    (prepare, launch/launcher.py): the rules across keys (recipe/rules.py) included, which
    the built sections run again once the keys read cleanly."""
    kl_rule = "kl_target: 0.05\n"  # rule: kl_target without kl_horizon (GRPOConfig's)
    path = recipe(
        tmp_path,
        "num_generation: 4\n"  # unknown key
        "learning_rate: fast\n"  # bad value
        "vllm_server_timeout: 0\n"  # range
        + kl_rule
        + "torch_dtype: float32\n",  # renamed key: the migration line
    )
    result = run([MAXENT_GRPO, "check", "--config", path], timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == f"5 problems in {path}"
    problems = lines[:-1]
    assert all(line.startswith(f"error: {path}: ") for line in problems), lines
    expected = [
        "unknown key 'num_generation'; did you mean 'num_generations'",
        "key 'learning_rate': 'fast' is invalid (expected float)",
        "key 'vllm_server_timeout': 0.0 is invalid (must be > 0)",
        "key 'torch_dtype' (transformers 5): renamed to dtype (TRL's ModelConfig); "
        "use dtype: float32 instead",
        "kl_horizon: not set; an adaptive beta needs both kl_target and kl_horizon",
    ]
    for fragment in expected:
        assert sum(fragment in line for line in problems) == 1, (fragment, lines)
    assert "Traceback" not in result.stderr
    # The keys fixed, building the sections (check's next stage) reports the rule.
    kl = "kl_horizon: not set; an adaptive beta needs both kl_target and kl_horizon"
    assert [kl in line for line in problems_of(["--config", recipe(tmp_path, kl_rule)])] == [True]


def test_the_trainer_path_reports_them_all_too(tmp_path):
    path = recipe(tmp_path, "num_generation: 4\nvllm_server_timeout: -1\n")
    result = run(
        [sys.executable, str(REPO / "src" / "grpo.py")] + ["--config", path],
        timeout=300,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3 and lines[-1] == f"2 problems in {path}", lines


def test_a_bad_value_is_one_problem_not_a_cascade(tmp_path):
    # The default (8 generations) standing in for the bad value would break the batch
    # arithmetic of 4 x 1 x 1 too: that is not reported as a second problem.
    path = recipe(tmp_path, "num_generations: four\n")
    assert problems_of(["--config", path]) == (
        f"{path}: key 'num_generations': 'four' is invalid (expected int)",
    )


def test_problems_of_reading_and_building_come_together(tmp_path):
    path = recipe(tmp_path, "no_such_key: 1\ngradient_accumulation_steps: 1\n")
    found = problems_of(["--config", path, "--num_generations", "8"], world_size=3)
    assert len(found) == 2
    assert "unknown key 'no_such_key'" in found[0]
    assert "x processes (3) x steps_per_generation (1) = 12" in found[1]


def test_one_problem_stays_one_line(tmp_path):
    path = recipe(tmp_path, "num_generation: 4\n")
    with pytest.raises(ConfigError) as info:
        read_recipe(["--config", path])
    report = error_report(info.value)
    assert "\n" not in report
    assert report.startswith(f"error: {path}: unknown key 'num_generation'; did you mean ")


def test_every_problem_of_a_maxent_section(tmp_path):
    path = recipe(tmp_path, "method: maxent\nmaxent_tau: 0\nloss_type: grpo\nmaxent_tau_lr: 0.2\n")
    found = problems_of(["--config", path])
    assert len(found) == 3, found
    assert all(line.startswith(f"{path}: ") for line in found)


# ---- item 4: the evaluation batch for the planned processes; the vllm_mode hint --------------

EVAL_7_PLUS_1 = dict(
    dataset_name="AI-MO/NuminaMath-TIR",  # evaluation needs a test split (the built-ins have none)
    dataset_test_split="test",
    do_eval=True,
    eval_strategy="steps",
    eval_steps=10,
    num_generations=14,
    per_device_train_batch_size=2,
    per_device_eval_batch_size=2,
    gradient_accumulation_steps=1,
)


def test_eval_batch_is_checked_for_the_planned_processes(tmp_path):
    keys = read_recipe(["--config", recipe(tmp_path, **EVAL_7_PLUS_1)])
    # 2 x 7 = 14 completions per evaluation batch: fine for 7 processes, although TRL alone
    # checks 2 x 1 (the launcher's own process) and refused it.
    training = build_recipe(keys, 7).training
    assert training.world_size == 1 and training.do_eval
    with pytest.raises(ConfigError) as info:
        build_recipe(keys, 8)
    found = info.value.problems if isinstance(info.value, ConfigProblems) else (str(info.value),)
    assert any(
        "per_device_eval_batch_size (2) x processes (8) = 16 completions per evaluation batch, "
        "not divisible by the evaluation's num_generations (14); set "
        "per_device_eval_batch_size: 7" in line
        for line in found
    ), found
    assert not any("The global eval batch size" in line for line in found), found


def test_eval_batch_rule_applies_only_when_evaluation_runs(tmp_path):
    without_test_split = {
        **EVAL_7_PLUS_1,
        "dataset_name": None,
        "dataset_test_split": None,
        "per_device_train_batch_size": 7,  # the training batch fits 8 processes
    }
    (line,) = problems_of(["--config", recipe(tmp_path, **without_test_split)], world_size=8)
    assert "the trainer evaluates the data's test split and this recipe has none" in line
    # off, the evaluation batch (2 x 8 = 16, not a multiple of 14) is not checked
    off = {**EVAL_7_PLUS_1, "eval_strategy": "no", "per_device_train_batch_size": 7}
    parse_recipe(["--config", recipe(tmp_path, **off)], world_size=8)


@pytest.mark.parametrize("mode, hint", [("colocate", True), ("server", False), (None, True)])
def test_failing_batch_of_a_vllm_recipe_suggests_vllm_mode_server(tmp_path, mode, hint):
    keys = {**EVAL_7_PLUS_1, "use_vllm": True, "vllm_mode": mode}
    found = problems_of(["--config", recipe(tmp_path, **keys)], world_size=8)
    assert len(found) == 2  # training and evaluation batches; TRL's repeats are not shown
    for line in found:
        assert ("set vllm_mode: server" in line) == hint, line
        assert "not divisible" in line


def test_no_vllm_no_server_hint(tmp_path):
    (line,) = problems_of(
        ["--config", recipe(tmp_path, num_generations=7, gradient_accumulation_steps=1)],
        world_size=8,
    )
    assert "vllm_mode" not in line


# ---- keys open-r1 recipes bring ------------------------------------------------------------


def test_open_r1_solution_column_is_read_as_the_answer_column(tmp_path):
    keys = read_recipe(["--config", recipe(tmp_path, dataset_solution_column="answer")])
    assert keys.dataset_answer_column == "answer"
    (note,) = keys.notes
    assert "key 'dataset_solution_column' is open-r1's name of dataset_answer_column" in note
    both = recipe(tmp_path, dataset_solution_column="a", dataset_answer_column="b")
    (line,) = problems_of(["--config", both])
    assert "keys 'dataset_solution_column' and 'dataset_answer_column' are the same" in line


def test_check_prints_the_alias_note(tmp_path, tiny_model):
    path = recipe(tmp_path, model_name_or_path=str(tiny_model), dataset_solution_column="solution")
    result = run([MAXENT_GRPO, "check", "--config", path], timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"note: {path}: key 'dataset_solution_column' is open-r1")
    assert "ok: " in result.stdout


@pytest.mark.parametrize(
    "value, scaled", [("false", "none"), ("true", "group"), ("batch", "batch")]
)
def test_scale_rewards_true_false_reach_trl_as_its_names(tmp_path, value, scaled):
    training = parse_recipe(["--config", recipe(tmp_path, f"scale_rewards: {value}\n")]).training
    assert training.scale_rewards == scaled
    flag = parse_recipe(["--config", recipe(tmp_path), "--scale_rewards", value]).training
    assert flag.scale_rewards == scaled


def test_maxent_accepts_the_neutral_scale_rewards_only(tmp_path):
    neutral = recipe(tmp_path, "method: maxent\nscale_rewards: false\n")
    assert parse_recipe(["--config", neutral]).training.scale_rewards == "none"
    batch = recipe(tmp_path, "method: maxent\nscale_rewards: batch\n")
    (line,) = problems_of(["--config", batch])
    assert "scale_rewards: 'batch' is not used by MaxEnt-GRPO" in line


def test_cosine_and_code_settings_are_recipe_keys_that_reach_the_rewards(tmp_path):
    path = recipe(
        tmp_path,
        "cosine_min_value_wrong: -1.0\ncosine_max_len: 500\nparallel_code_exec_per_proc: 3\n"
        "code_timeout_seconds: 2\n",
    )
    script = parse_recipe(["--config", path]).script
    settings = script.reward_settings(128)
    assert settings["cosine_min_value_wrong"] == -1.0 and settings["cosine_max_len"] == 500
    assert settings["parallel_code_exec_per_proc"] == 3
    assert settings["code_timeout_seconds"] == 2.0
    assert settings["cosine_max_value_correct"] == 1.0  # the registry's default


# ---- GRPO's KL keys (the controller: tests/test_grpo_adaptive_kl.py) ----------------------


def test_grpo_init_kl_coeff_is_trls_beta(tmp_path):
    training = parse_recipe(["--config", recipe(tmp_path, init_kl_coeff=0.04)]).training
    assert training.beta == 0.04
    assert parse_recipe(["--config", recipe(tmp_path, beta=0.02)]).training.beta == 0.02
    (line,) = problems_of(["--config", recipe(tmp_path, beta=0.02, init_kl_coeff=0.04)])
    assert "beta: 0.02 and init_kl_coeff: 0.04: both are the initial KL coefficient" in line


def test_grpo_adaptive_kl_rules(tmp_path):
    (line,) = problems_of(["--config", recipe(tmp_path, kl_target=0.05, kl_horizon=100)])
    assert "an adaptive beta (kl_target) multiplies beta, so it must start > 0" in line
    adaptive = recipe(tmp_path, init_kl_coeff=0.05, kl_target=0.05, kl_horizon=16)
    assert parse_recipe(["--config", adaptive], world_size=4).training.kl_horizon == 16
    (line,) = problems_of(["--config", adaptive], world_size=5)
    assert "kl_horizon: 16: below the 20 completions of one optimizer step" in line


def test_a_data_problem_does_not_stop_the_later_checks(tmp_path):
    """check_recipe: the loader's DataError (a missing local file) is one problem among the
    others; the rules after it (here output_dir's) still run."""
    from maxent_grpo.preflight import check_recipe

    missing = tmp_path / "missing.jsonl"
    (tmp_path / "a-file").write_text("")
    path = recipe(tmp_path, dataset_name=str(missing), output_dir=str(tmp_path / "a-file" / "x"))
    with pytest.raises(ConfigProblems) as info:
        check_recipe(parse_recipe(["--config", path]))
    lines = info.value.problems
    assert [str(missing) in line for line in lines] == [True, False], lines
    assert "a-file is a file" in lines[1], lines
