"""The committed key schema (recipe/schema.json) against the dataclasses, and the launcher's
TRL-free reader against TRL's own parser on every recipe."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from helpers.paths import REPO
from maxent_grpo.errors import ConfigError
from maxent_grpo.recipe import read_recipe, schema
from maxent_grpo.recipe.sections import SECTIONS

RECIPES = sorted(
    p for p in (REPO / "recipes").rglob("*.yaml") if "accelerate_configs" not in p.parts
)
# Flags over each recipe: bool spellings, nargs lists, choices, converters, None sentinels.
OVERRIDES = [
    [],
    ["--max_steps", "7", "--learning_rate", "3e-6"],
    ["--bf16", "false", "--no_gradient_checkpointing", "--use_vllm", "--log_on_each_node", "no"],
    ["--reward_funcs", "accuracy", "format", "--reward_weights", "1", "0.5"],
    ["--vllm_mode", "server", "--scale_rewards", "false", "--lr_scheduler_type", "cosine"],
    ["--max_grad_norm", "inf", "--overlong_max_length", "none", "--report-to", "none"],
    ["--eval_strategy", "steps", "--debug", "underflow_overflow", "--seed=3"],
]
BAD_OVERRIDES = [
    ["--max_step", "3"],
    ["--vllm_mode", "remote"],
    ["--scale_rewards", "maybe"],
    ["--bf16", "perhaps"],
    ["--debug", "nope"],
    ["--learning_rate", "fast"],
]


def reference_parser(method: str):
    """TRL's own parser of the method's sections (what the trainers parsed before the schema)."""
    return schema.trl_parser(SECTIONS[method])


def same(a, b) -> bool:
    """Equal and of one type (a str enum of TRL's equals its value, which we read)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a == b and (type(a) is type(b) or isinstance(a, str))


def test_committed_schema_is_current():
    fresh = schema.render(schema.generate())
    assert schema.SCHEMA_PATH.read_text() == fresh, (
        f"{schema.SCHEMA_PATH.name} is out of date (recipe/*_keys.py, recipe/keys.py or TRL "
        f"changed); run: {schema.WRITE_COMMAND}"
    )


def test_json_round_trip_of_odd_values():
    values = [float("inf"), -float("inf"), (1, "a"), {"x": (2.5,)}, [None, True], 3, "s"]
    for value in values:
        assert schema.decode(json.loads(json.dumps(schema.encode(value)))) == value
    nan = schema.decode(json.loads(json.dumps(schema.encode(float("nan")))))
    assert math.isnan(nan)
    with pytest.raises(TypeError):
        schema.encode(object())


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(REPO)))
@pytest.mark.parametrize("flags", OVERRIDES, ids=lambda f: " ".join(f) or "no flags")
def test_schema_reader_matches_trl_parser(recipe, flags):
    argv = ["--config", str(recipe), *flags]
    method = read_recipe(["--config", str(recipe)]).method
    known = schema.method_keys(method)
    names = [f[2:].split("=")[0].replace("-", "_") for f in flags if f.startswith("--")]
    if any(n not in known and n.removeprefix("no_") not in known for n in names):
        # GRPO's flags over an SFT recipe: both parsers refuse them, with the same lines.
        with pytest.raises(ConfigError) as ours_error:
            read_recipe(argv)
        with pytest.raises(ConfigError) as reference_error:
            read_recipe(argv, parser_for=reference_parser)
        assert str(ours_error.value) == str(reference_error.value)
        return
    ours = read_recipe(argv)
    reference = read_recipe(argv, parser_for=reference_parser)
    assert ours.method == reference.method and ours.env == reference.env
    assert set(ours.values) == set(reference.values)
    different = {
        k: (ours.values[k], reference.values[k])
        for k in ours.values
        if not same(ours.values[k], reference.values[k])
    }
    assert not different


@pytest.mark.parametrize("flags", BAD_OVERRIDES, ids=" ".join)
def test_schema_reader_refuses_what_trl_parser_refuses(flags):
    argv = ["--config", str(REPO / "recipes/smoke/config_grpo.yaml"), *flags]
    with pytest.raises(ConfigError) as ours:
        read_recipe(argv)
    with pytest.raises(ConfigError) as reference:
        read_recipe(argv, parser_for=reference_parser)
    assert str(ours.value) == str(reference.value)


def test_launcher_imports_no_training_stack(tmp_path):
    """prepare() (plan, sbatch, submit, every attempt) reads, checks and plans without TRL."""
    code = f"""
import sys
from pathlib import Path
from maxent_grpo.launch.launcher import RunRequest, prepare
request = RunRequest(recipe={str(REPO / "recipes/smoke/config_grpo.yaml")!r},
                     overrides=("--output_dir", {str(tmp_path / "out")!r}))
print(prepare(request, packages=True).describe())
heavy = sorted({{"torch", "trl", "transformers", "datasets", "peft"}} & set(sys.modules))
assert not heavy, heavy
"""
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]


def test_refusals_by_the_schema_import_no_training_stack(tmp_path):
    """check, sbatch and submit refuse a recipe the schema refuses (a bad type, no dataset)
    with its lines, exit 2 and no TRL or torch import (before: 6 s of imports, then the same
    lines); plan (the path of run and training.sh) refuses the missing dataset too."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"model_name_or_path: x\nlearning_rate: fast\noutput_dir: {tmp_path}/out\n")
    untyped = tmp_path / "no_data.yaml"  # every key well typed: the launcher's checks find it
    untyped.write_text(f"model_name_or_path: x\noutput_dir: {tmp_path}/out\n")
    # No output_dir: the build would fill in TRL's default, which the launcher refuses at start.
    nowhere = tmp_path / "no_output.yaml"
    nowhere.write_text("model_name_or_path: x\ndataset_name: builtin:arithmetic\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/sbatch").write_text("#!/bin/sh\nexit 1\n")  # on PATH; never reached
    (tmp_path / "bin/sbatch").chmod(0o755)
    code = f"""
import sys
from maxent_grpo.cli import main
for command in ("check", "sbatch", "submit", "plan"):
    recipe = {str(untyped)!r} if command == "plan" else {str(bad)!r}
    print(command, main([command, "--config", recipe]), file=sys.stderr)
print("check", main(["check", "--config", {str(nowhere)!r}]), file=sys.stderr)
print(sorted({{"torch", "trl", "transformers", "datasets", "peft"}} & set(sys.modules)))
"""
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "[]"  # no heavy library imported by any of the four
    dataset = (
        "dataset_name / dataset_mixture: exactly one is required (neither is set); set "
        "dataset_name (hub id, builtin:NAME or local path) or dataset_mixture"
    )
    refusal = [
        f"error: {bad}: key 'learning_rate': 'fast' is invalid (expected float)",
        f"error: {bad}: {dataset}",
        f"2 problems in {bad}",
    ]
    expected = [*refusal, "check 2", *refusal, "sbatch 2", *refusal, "submit 2"]
    expected += [f"error: {untyped}: {dataset}", "plan 2"]
    expected += [f"error: {nowhere}: output_dir: not set; give a writable directory", "check 2"]
    assert run.stderr.splitlines() == expected
