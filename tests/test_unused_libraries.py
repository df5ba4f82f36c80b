"""Trainers mark the optional libraries a run does not use absent before TRL is imported."""

from __future__ import annotations

import importlib.util

import pytest

from helpers.recipes import write_recipe
from helpers.trainer_imports import trainer_imports
from maxent_grpo.recipe import read_recipe
from maxent_grpo.train.unused_libraries import unused_libraries


@pytest.mark.parametrize(
    ("keys", "unused"),
    [
        ({}, ["wandb", "vllm", "peft"]),
        ({"report_to": ["wandb", "tensorboard"]}, ["vllm", "peft"]),
        ({"report_to": "all"}, ["vllm", "peft"]),
        ({"use_vllm": True, "vllm_mode": "server"}, ["wandb", "peft"]),
        ({"benchmarks": ["arithmetic"]}, ["wandb", "peft"]),  # inline evaluation may use vLLM
        ({"use_peft": True}, ["wandb", "vllm"]),
    ],
)
def test_the_libraries_a_recipe_does_not_use(tmp_path, keys, unused):
    recipe = write_recipe(tmp_path, **keys)
    assert unused_libraries(read_recipe(["--config", str(recipe)])) == unused


@pytest.mark.parametrize(
    ("report_to", "loaded"), [("none", False), (["tensorboard"], False), (["wandb"], True)]
)
def test_trl_loads_wandb_only_for_runs_that_report_to_it(tmp_path, report_to, loaded):
    if importlib.util.find_spec("wandb") is None:
        pytest.fail("wandb is a core dependency and must be installed")
    imports = trainer_imports(write_recipe(tmp_path, report_to=report_to))
    assert imports["wandb"] == [loaded, loaded]


@pytest.mark.parametrize("use_peft", [False, True])
def test_transformers_loads_peft_only_for_lora_runs(tmp_path, use_peft):
    if importlib.util.find_spec("peft") is None:
        pytest.fail("the test environment installs the peft extra (tests/test_peft.py)")
    imports = trainer_imports(write_recipe(tmp_path, use_peft=use_peft))
    assert imports["peft"] == [use_peft, use_peft]
