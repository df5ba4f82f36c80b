"""Recipe parsing: unknown keys, types, precedence, early validation with one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from maxent_grpo.configs import ConfigError, LaunchArguments, ScriptArguments, parse_recipe
from maxent_grpo.preflight import check_recipe

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "recipes" / "smoke" / "config_grpo.yaml"


def recipe(tmp_path: Path, text: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


BASE = """\
model_name_or_path: .cache/models/tiny-qwen2
dataset_name: builtin:arithmetic
output_dir: {out}
use_cpu: true
bf16: false
num_generations: 4
per_device_train_batch_size: 4
report_to: none
"""


def base(tmp_path: Path, extra: str = "") -> str:
    return recipe(tmp_path, BASE.format(out=tmp_path / "out") + extra)


def error_of(argv, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        parse_recipe(argv, **kwargs)
    message = str(info.value)
    assert "\n" not in message, "errors must be one line"
    return message


def test_smoke_recipe_parses_into_four_dataclasses():
    script, training, model, launch = parse_recipe(["--config", str(SMOKE)])
    assert isinstance(script, ScriptArguments) and isinstance(launch, LaunchArguments)
    assert script.dataset_name == "builtin:arithmetic"
    assert training.num_generations == 4 and training.bf16 is False
    assert model.model_name_or_path == ".cache/models/tiny-qwen2"


def test_cli_overrides_yaml_and_yaml_overrides_defaults(tmp_path):
    path = base(tmp_path, "learning_rate: 0.01\nmax_steps: 7\n")
    _, training, _, _ = parse_recipe(["--config", path, "--max_steps", "3"])
    assert training.max_steps == 3  # CLI wins
    assert training.learning_rate == 0.01  # YAML wins over the default
    assert training.temperature == 1.0  # default


def test_yaml_scientific_notation_string_becomes_float(tmp_path):
    # YAML 1.1 reads 1e-5 as a string; the CLI path would convert it, so must we.
    _, training, _, _ = parse_recipe(["--config", base(tmp_path, "learning_rate: 1e-5\n")])
    assert training.learning_rate == pytest.approx(1e-5)


def test_unknown_yaml_key_names_key_file_and_closest(tmp_path):
    path = base(tmp_path, "num_generation: 4\n")
    message = error_of(["--config", path])
    assert message.startswith(f"{path}: unknown key 'num_generation'")
    assert "'num_generations'" in message


def test_unknown_cli_flag_is_one_line(tmp_path):
    message = error_of(["--config", base(tmp_path), "--no_such_key", "1"])
    assert "unknown flag '--no_such_key'" in message


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("num_generations: four", "key 'num_generations': 'four' is invalid (expected int)"),
        ("bf16: [1]", "key 'bf16'"),
        ("lr_scheduler_type: sometimes", "expected one of linear"),
        ("max_steps: 2.5", "key 'max_steps'"),
        ("learning_rate: true", "key 'learning_rate'"),
        ("reward_funcs: {a: 1}", "key 'reward_funcs'"),
    ],
)
def test_wrong_types_are_rejected_with_the_key(tmp_path, line, fragment):
    assert fragment in error_of(["--config", base(tmp_path, line + "\n")])


def test_malformed_yaml_gives_line_and_column(tmp_path):
    path = recipe(tmp_path, "a: [1\nb: 2\n")
    message = error_of(["--config", path])
    assert "invalid YAML" in message and "line" in message


def test_non_mapping_and_missing_file(tmp_path):
    assert "YAML mapping" in error_of(["--config", recipe(tmp_path, "- a\n- b\n")])
    assert "recipe file not found" in error_of(["--config", str(tmp_path / "nope.yaml")])


def test_env_block_is_exported(tmp_path, monkeypatch):
    monkeypatch.delenv("MAXENT_GRPO_TEST_VAR", raising=False)
    parse_recipe(["--config", base(tmp_path, "env:\n  MAXENT_GRPO_TEST_VAR: hello\n")])
    assert os.environ.pop("MAXENT_GRPO_TEST_VAR") == "hello"


def test_batch_arithmetic_error_shows_the_arithmetic(tmp_path):
    path = base(tmp_path, "gradient_accumulation_steps: 1\n")
    message = error_of(["--config", path, "--num_generations", "8"], world_size=3)
    assert "per_device_train_batch_size (4) x processes (3) x steps_per_generation (1) = 12" in (
        message
    )
    assert "num_generations (8)" in message and "per_device_train_batch_size: 8" in message


@pytest.mark.parametrize("world_size, ok", [(1, False), (2, True), (3, False), (4, True)])
def test_batch_arithmetic_depends_on_the_planned_processes(tmp_path, world_size, ok):
    argv = ["--config", base(tmp_path), "--per_device_train_batch_size", "4"]
    argv += ["--num_generations", "8"]
    if ok:
        _, training, _, _ = parse_recipe(argv, world_size=world_size)
        assert training.generation_batch_size == 4 * world_size
    else:
        error_of(argv, world_size=world_size)


def test_realistic_recipes_parse_for_their_planned_gpus():
    for path in sorted((REPO / "recipes").glob("*/*/config_*.yaml")):
        types = None
        if "maxent" in path.parent.name:
            pytest.importorskip("maxent_grpo.maxent.config")
            from maxent_grpo.maxent.config import MAXENT_TYPES as types
        kwargs = {"types": types} if types else {}
        parsed = parse_recipe(["--config", str(path), "--use_cpu", "true"], world_size=7, **kwargs)
        assert parsed[1].num_generations >= 2, path


def parsed(tmp_path, extra="", *flags):
    return parse_recipe(["--config", base(tmp_path, extra), *flags])


def test_check_recipe_accepts_the_smoke_setup(tmp_path, tiny_model):
    script, training, model, _ = parsed(tmp_path, "", "--model_name_or_path", str(tiny_model))
    assert check_recipe(script, training, model) is None


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ("reward_funcs: [acuracy]\n", "unknown reward 'acuracy'"),
        ("reward_funcs: ['no_such_module_xyz:f']\n", "No module named 'no_such_module_xyz'"),
        ("reward_weights: [1.0, 2.0]\n", "reward_weights: 2 weights for 1 reward_funcs"),
        ("dataset_mixture: {datasets: []}\n", "dataset_mixture"),
        ("dataset_prompt_column: question\n", "question"),
    ],
)
def test_check_recipe_rejects_bad_inputs_early(tmp_path, tiny_model, extra, fragment):
    from maxent_grpo.errors import UserError

    script, training, model, _ = parsed(tmp_path, extra, "--model_name_or_path", str(tiny_model))
    if "dataset_mixture" in extra:
        script.dataset_name = None
    with pytest.raises(UserError) as info:
        check_recipe(script, training, model)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_check_recipe_rejects_missing_model_and_unwritable_output(tmp_path, tiny_model):
    script, training, model, _ = parsed(tmp_path, "", "--model_name_or_path", "./no/such/model")
    with pytest.raises(ConfigError, match="not a model directory"):
        check_recipe(script, training, model)

    blocker = tmp_path / "file"
    blocker.write_text("")
    script, training, model, _ = parsed(
        tmp_path, "", "--model_name_or_path", str(tiny_model), "--output_dir", str(blocker / "x")
    )
    with pytest.raises(ConfigError, match="not writable"):
        check_recipe(script, training, model)


def test_steps_per_generation_follows_the_planned_processes(tmp_path):
    argv = ["--config", base(tmp_path), "--num_generations", "8"]
    argv += ["--gradient_accumulation_steps", "2"]
    _, training, _, _ = parse_recipe(argv, world_size=4)
    # TRL alone would derive 8 from the parsing process's world size of 1.
    assert training.steps_per_generation == 2
    assert training.generation_batch_size == 4 * 4 * 2
