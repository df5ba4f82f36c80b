"""reference_model_name_or_path: the KL reference is the recipe's model, not a copy of the policy.

Real CPU runs of src/grpo.py and src/maxent-grpo.py on two tiny models that differ only in
their weights (same tokenizer, another seed): at step 1 the policy is still the starting model,
so the logged KL is 0 against a copy of it (TRL's default reference) and positive against the
other model.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.recipes import SMOKE_MAXENT, small_recipe
from helpers.runs import REPO, child_env, step_logs
from maxent_grpo.errors import ConfigError
from maxent_grpo.recipe import read_recipe
from maxent_grpo.recipe.checks import check_keys, check_same_vocabulary
from maxent_grpo.tiny_model import build_tiny_model

SCRIPTS = {"grpo": REPO / "src" / "grpo.py", "maxent": REPO / "src" / "maxent-grpo.py"}
KL = {"grpo": "kl", "maxent": "maxent/kl"}


@pytest.fixture(scope="module")
def other_model(tmp_path_factory) -> Path:
    """The tiny model's architecture and tokenizer with other weights."""
    return build_tiny_model(tmp_path_factory.mktemp("reference") / "tiny-seed1", seed=1)


def first_kl(folder: Path, tiny_model: Path, method: str, reference: Path) -> float:
    """The KL logged at step 1 of a 2-step run whose reference is `reference`."""
    base = {"base": SMOKE_MAXENT} if method == "maxent" else {"init_kl_coeff": 0.05}
    recipe = small_recipe(
        folder,
        tiny_model,
        **base,
        max_steps=2,
        logging_steps=1,
        kl_target=None,
        kl_horizon=None,
        reference_model_name_or_path=str(reference),
    )
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS[method]), "--config", str(recipe)],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return step_logs(folder / "out")[1][KL[method]]


@pytest.mark.integration
@pytest.mark.parametrize("method", ["grpo", "maxent"])
def test_the_kl_is_computed_against_the_reference_model(tmp_path, tiny_model, other_model, method):
    # Against a copy of the starting policy (the default) the KL at step 1 is 0: nothing has
    # been updated yet. Against the other model it is not.
    assert first_kl(tmp_path, tiny_model, method, other_model) > 1e-3


def test_a_reference_with_another_vocabulary_is_refused_in_one_line(tmp_path, tiny_model):
    from transformers import AutoTokenizer

    other = tmp_path / "other-vocab"
    shutil.copytree(tiny_model, other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<extra_token>"])
    tokenizer.save_pretrained(other)
    check_same_vocabulary(str(tiny_model), None, str(tiny_model), None)  # same: no error
    with pytest.raises(ConfigError) as err:
        check_same_vocabulary(str(tiny_model), None, str(other), None)
    line = str(err.value)
    assert "\n" not in line and line.startswith("reference_model_name_or_path:")
    assert "'<extra_token>'" in line and "vocabulary" in line


def test_the_launcher_refuses_a_reference_path_that_is_no_model(tmp_path, tiny_model):
    recipe = small_recipe(
        tmp_path, tiny_model, init_kl_coeff=0.05, reference_model_name_or_path=str(tmp_path)
    )
    keys = read_recipe(["--config", str(recipe)])
    with pytest.raises(ConfigError) as err:
        check_keys(keys, 1)
    assert f"reference_model_name_or_path: '{tmp_path}' is not a model directory" in str(err.value)


def test_trl_global_is_restored_and_untouched_without_a_reference(tiny_model, other_model):
    from types import SimpleNamespace

    from trl.trainer import grpo_trainer

    from maxent_grpo.train.reference_model import reference_model

    original = grpo_trainer.create_model_from_path
    model_args = SimpleNamespace(
        model_name_or_path=str(tiny_model), model_revision=None, use_peft=False
    )
    training = SimpleNamespace(
        reference_model_name_or_path=str(other_model), reference_model_revision=None, beta=0.05
    )
    with reference_model(training, model_args):
        assert grpo_trainer.create_model_from_path is not original
    assert grpo_trainer.create_model_from_path is original
    for unused in (dict(beta=0.0), dict(reference_model_name_or_path=None)):
        with reference_model(SimpleNamespace(**{**vars(training), **unused}), model_args):
            assert grpo_trainer.create_model_from_path is original
