"""Recipe parsing: unknown keys, types, precedence, early validation with one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.recipes import MINIMAL, SMOKE, SMOKE_MAXENT, SMOKE_VLLM, write_recipe
from maxent_grpo.preflight import check_recipe
from maxent_grpo.recipe import ConfigError, Recipe, build_recipe, parse_recipe, read_recipe
from maxent_grpo.recipe.keys import LauncherKeys, ScriptArguments

BASE = MINIMAL


def recipe(tmp_path: Path, text: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


def base(tmp_path: Path, extra: str = "") -> str:
    path = write_recipe(tmp_path, base=None, **BASE)
    path.write_text(path.read_text() + extra)
    return str(path)


def error_of(argv, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        parse_recipe(argv, **kwargs)
    message = str(info.value)
    assert "\n" not in message, "errors must be one line"
    return message


def test_smoke_recipe_parses_into_one_typed_recipe():
    import yaml

    written = yaml.safe_load(SMOKE.read_text())
    recipe = parse_recipe(["--config", str(SMOKE)])
    assert isinstance(recipe, Recipe) and recipe.method == "grpo" and recipe.path == str(SMOKE)
    assert isinstance(recipe.script, ScriptArguments) and isinstance(recipe.launch, LauncherKeys)
    assert recipe.script.dataset_name == "builtin:arithmetic"
    assert recipe.training.num_generations == written["num_generations"]
    assert recipe.training.bf16 is False
    assert recipe.model.model_name_or_path == ".cache/models/tiny-qwen2"


def test_cli_overrides_yaml_and_yaml_overrides_defaults(tmp_path):
    path = base(tmp_path, "learning_rate: 0.01\nmax_steps: 7\n")
    recipe = parse_recipe(["--config", path, "--max_steps", "3"])
    training = recipe.training
    assert recipe.overrides == ("--max_steps", "3")
    assert training.max_steps == 3  # CLI wins
    assert training.learning_rate == 0.01  # YAML wins over the default
    assert training.temperature == 1.0  # default


def test_yaml_scientific_notation_string_becomes_float(tmp_path):
    # YAML 1.1 reads 1e-5 as a string; the CLI path would convert it, so must we.
    training = parse_recipe(["--config", base(tmp_path, "learning_rate: 1e-5\n")]).training
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


def test_env_block_is_carried_not_exported(tmp_path, monkeypatch):
    monkeypatch.delenv("MAXENT_GRPO_TEST_VAR", raising=False)
    recipe = parse_recipe(["--config", base(tmp_path, "env:\n  MAXENT_GRPO_TEST_VAR: 7\n")])
    assert recipe.env == {"MAXENT_GRPO_TEST_VAR": "7"}
    assert "MAXENT_GRPO_TEST_VAR" not in os.environ
    assert "key 'env' must be a mapping" in error_of(["--config", base(tmp_path, "env: [a]\n")])


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
        training = parse_recipe(argv, world_size=world_size).training
        assert training.generation_batch_size == 4 * world_size
    else:
        error_of(argv, world_size=world_size)


# The model recipes (recipes/MODEL/METHOD/config_*.yaml): a new one is added here.
MODEL_RECIPES = [
    "Qwen2.5-1.5B-Instruct/grpo/config_math.yaml",
    "Qwen2.5-1.5B-Instruct/grpo/config_tools.yaml",
    "Qwen2.5-1.5B-Instruct/maxent-grpo/config_math.yaml",
    "Qwen2.5-1.5B-Instruct/sft/config_demo.yaml",
]
# A recipe's folder names its method (recipes/<Model>/<method>/config_<task>.yaml).
FOLDER_METHODS = {"grpo": "grpo", "maxent-grpo": "maxent", "sft": "sft"}


def test_realistic_recipes_parse_for_their_planned_gpus():
    found = sorted((REPO / "recipes").glob("*/*/config_*.yaml"))
    assert [str(p.relative_to(REPO / "recipes")) for p in found] == MODEL_RECIPES
    for path in found:
        recipe = parse_recipe(["--config", str(path), "--use_cpu", "true"], world_size=7)
        assert recipe.method == FOLDER_METHODS[path.parent.name], path
        if recipe.method != "sft":
            assert recipe.training.num_generations >= 2, path


def parsed(tmp_path, extra="", *flags):
    return parse_recipe(["--config", base(tmp_path, extra), *flags])


def test_check_recipe_accepts_the_smoke_setup(tmp_path, tiny_model):
    recipe = parsed(tmp_path, "", "--model_name_or_path", str(tiny_model))
    assert check_recipe(recipe).script.dataset_name == "builtin:arithmetic"


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

    recipe = parsed(tmp_path, extra, "--model_name_or_path", str(tiny_model))
    if "dataset_mixture" in extra:
        recipe.script.dataset_name = None
    with pytest.raises(UserError) as info:
        check_recipe(recipe)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_check_recipe_rejects_missing_model_and_unwritable_output(tmp_path, tiny_model):
    recipe = parsed(tmp_path, "", "--model_name_or_path", "./no/such/model")
    with pytest.raises(ConfigError, match="not a model directory"):
        check_recipe(recipe)
    adapter = tmp_path / "lora-output"  # what a use_peft run saves
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    recipe = parsed(tmp_path, "", "--model_name_or_path", str(adapter))
    with pytest.raises(ConfigError, match=r"is a PEFT adapter .*merge_and_unload"):
        check_recipe(recipe)

    blocker = tmp_path / "file"
    blocker.write_text("")
    recipe = parsed(
        tmp_path, "", "--model_name_or_path", str(tiny_model), "--output_dir", str(blocker / "x")
    )
    with pytest.raises(ConfigError, match="not writable"):
        check_recipe(recipe)


def test_steps_per_generation_follows_the_planned_processes(tmp_path):
    argv = ["--config", base(tmp_path), "--num_generations", "8"]
    argv += ["--gradient_accumulation_steps", "2"]
    training = parse_recipe(argv, world_size=4).training
    # TRL alone would derive 8 from the parsing process's world size of 1.
    assert training.steps_per_generation == 2
    assert training.generation_batch_size == 4 * 4 * 2


@pytest.mark.parametrize("world_size", [1, 2, 7])
def test_explicit_steps_per_generation_survives_the_planned_processes(tmp_path, world_size):
    # Was: re-derived from a generation batch computed for 1 process (4 // 7 == 0 at 7).
    argv = ["--config", base(tmp_path), "--per_device_train_batch_size", "2"]
    argv += ["--num_generations", "8", "--steps_per_generation", "4"]
    training = parse_recipe(argv, world_size=world_size).training
    assert training.steps_per_generation == 4
    assert training.generation_batch_size == 2 * world_size * 4


def test_explicit_generation_batch_size_is_checked_for_the_planned_processes(tmp_path):
    argv = ["--config", base(tmp_path), "--generation_batch_size", "16"]
    assert parse_recipe(argv, world_size=2).training.steps_per_generation == 2
    assert "not a multiple of per_device_train_batch_size (4) x processes (3)" in error_of(
        argv, world_size=3
    )


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("vllm_mode: serve", "key 'vllm_mode': 'serve' is invalid (expected one of colocate"),
        ("vllm_server_device: tpu", "key 'vllm_server_device': 'tpu' is invalid"),
        ("vllm_weight_sync: rdma", "key 'vllm_weight_sync': 'rdma' is invalid"),
        ("vllm_tensor_parallel_size: 0", "key 'vllm_tensor_parallel_size': 0 is invalid (must"),
        ("vllm_server_timeout: 0", "key 'vllm_server_timeout': 0.0 is invalid (must be > 0)"),
    ],
)
def test_choices_and_ranges_are_checked_on_every_path(tmp_path, line, fragment):
    path = base(tmp_path, line + "\n")
    assert fragment in error_of(["--config", path])  # the trainer's path (src/grpo.py)
    with pytest.raises(ConfigError, match=fragment.split(" is invalid")[0]):
        read_recipe(["--config", path])  # the launcher's path, before any plan


def test_a_recipe_declares_its_method(tmp_path):
    path = write_recipe(tmp_path, base=SMOKE_MAXENT)
    assert read_recipe(["--config", str(path)]).method == "maxent"
    assert read_recipe(["--config", str(path)], "maxent").method == "maxent"
    assert read_recipe(["--config", str(SMOKE)]).method == "grpo"
    assert read_recipe(["--config", str(SMOKE)], "maxent").method == "maxent"
    message = error_of(["--config", str(path)], method="grpo")
    assert "the recipe says method: maxent but --method grpo" in message
    bad = write_recipe(tmp_path, base=SMOKE, name="bad.yaml", method="ppo")
    assert "key 'method': 'ppo' is invalid (expected one of grpo, maxent, sft)" in error_of(
        ["--config", str(bad)]
    )


def test_keys_are_read_once_and_built_for_any_world_size(tmp_path):
    keys = read_recipe(["--config", base(tmp_path), "--num_generations", "8"])
    assert keys.num_generations == 8 and keys.vllm_server_timeout == 1200.0
    assert build_recipe(keys, 2).training.generation_batch_size == 8
    assert build_recipe(keys, 4).training.generation_batch_size == 16
    with pytest.raises(ConfigError, match="x processes \\(3\\)"):
        build_recipe(keys, 3)


@pytest.mark.parametrize("timeout, ok", [(1799, True), (1800, False)])
def test_server_wait_must_end_before_the_other_ranks_give_up(tmp_path, timeout, ok):
    from maxent_grpo.recipe.checks import check_keys
    from maxent_grpo.recipe.rules import check_server_wait

    path = write_recipe(tmp_path, base=SMOKE_VLLM, vllm_server_timeout=timeout)
    keys = read_recipe(["--config", str(path)])
    if ok:
        check_keys(keys, 2)
        check_server_wait(build_recipe(keys, 2).training)  # the trainers' check: the same rule
        return
    for check in (lambda: check_keys(keys, 2), lambda: check_recipe(build_recipe(keys, 2))):
        with pytest.raises(ConfigError) as error:
            check()
        assert f"vllm_server_timeout: {timeout} s is not below ddp_timeout (1800 s)" in str(
            error.value
        )
