"""While the trainer is built, a constructor's check refusing a recipe's value is a user error
(one line naming the key); anything else raised there is a crash with its traceback."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest

from helpers.recipes import small_recipe
from maxent_grpo.errors import ConfigError
from maxent_grpo.recipe import parse_recipe
from maxent_grpo.train.entry import _refused_values, raised_by_a_check


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("refused")
    return parse_recipe(["--config", str(small_recipe(folder, reward_weights=[1.0, 0.5]))])


class RefusingTrainer:
    """Like TRL's GRPOTrainer.__init__: a check of its arguments raises."""

    def __init__(self, weights: int):
        if weights != 3:
            raise ValueError(
                f"Number of reward weights ({weights}) must match\n number of reward functions"
            )


@dataclasses.dataclass
class RefusingConfig:
    temperature: float = 1.0

    def __post_init__(self):
        assert self.temperature > 0, "temperature must be positive"


def _tokenize(text):
    raise ValueError("reward_weights: bad UTF-8 in the tokenizer's cache")  # a library's bug


class BuggyTrainer:
    def __init__(self, kind: str):
        if kind == "deep":
            _tokenize("x")  # raised below the constructor, though it names a key
        if kind == "call":
            int("reward_weights")  # a failing call in the constructor, not a check
        if kind == "lookup":
            {"a": 1}["reward_weights"]


def test_a_constructor_check_refusing_a_value_is_one_line_naming_the_key(recipe):
    with pytest.raises(ConfigError) as info, _refused_values(recipe):
        RefusingTrainer(weights=2)
    assert str(info.value) == (
        f"{recipe.path}: key 'reward_weights' ([1.0, 0.5]): the trainer refused it: "
        "Number of reward weights (2) must match number of reward functions; fix reward_weights"
    )
    assert isinstance(info.value.__cause__, ValueError)


def test_a_config_check_is_a_refusal_too(recipe):
    with pytest.raises(ConfigError, match=r"key 'temperature' \(.*\): the trainer refused it"):
        with _refused_values(recipe):
            RefusingConfig(temperature=-1.0)


def test_a_refusal_naming_no_key_still_names_the_recipe(recipe):
    class NoKey:
        def __init__(self):
            raise NotImplementedError("this model cannot be trained with these settings")

    with pytest.raises(ConfigError) as info, _refused_values(recipe):
        NoKey()
    assert str(info.value) == (
        f"{recipe.path}: the trainer refused the recipe: NotImplementedError: this model "
        "cannot be trained with these settings"
    )


@pytest.mark.parametrize(("kind", "error"), [("deep", ValueError), ("call", ValueError)])
def test_a_library_bug_while_the_trainer_is_built_is_a_crash(recipe, kind, error):
    with pytest.raises(error) as info, _refused_values(recipe):
        BuggyTrainer(kind)
    assert not raised_by_a_check(info.value)
    assert "reward_weights" in str(info.value)  # named a key, still not the recipe's fault


def test_other_classes_keep_their_own(recipe):
    with pytest.raises(KeyError), _refused_values(recipe):
        BuggyTrainer("lookup")
    with pytest.raises(MemoryError), _refused_values(recipe):
        raise MemoryError  # the launcher's oom


def test_the_crash_reaches_the_log_with_its_traceback(tmp_path, tiny_model):
    """The trainer process, with a trainer class whose constructor hits a library bug: the
    traceback is on stderr (the train log), not a one-line user error, and the exit is not 2."""
    path = small_recipe(tmp_path, tiny_model, output_dir=str(tmp_path / "out"))
    code = textwrap.dedent(
        f"""
        import sys
        from maxent_grpo import train_process

        class Trainer:
            def __init__(self, **kwargs):
                {{}}["reward_weights"]  # a library's failing lookup

        train_process.trainer_class = lambda method: Trainer
        sys.exit(train_process.cli_main(["--config", {str(path)!r}]))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode not in (0, 2), result.stderr[-2000:]
    assert "Traceback (most recent call last)" in result.stderr
    assert "KeyError: 'reward_weights'" in result.stderr
    assert "error: " not in result.stderr.splitlines()[-1]
