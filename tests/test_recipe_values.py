"""Bad values never reach a traceback: every enumerated key gets an unknown value and every
range-bounded key an out-of-range one, and each is one line naming the file, the key and the
value, before any model is loaded.

The corpus is parametrised from the declarations (recipe/ranges.py TRL_KEYS and our fields,
through the committed schema), and TRL's are checked against the libraries: a new enumerated
field of TRL's GRPOConfig or ModelConfig fails here until it has choices or is declared in
UNCHECKED.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import subprocess
import typing
from pathlib import Path

import pytest

from helpers.recipes import write_recipe
from helpers.runs import PYTHON
from maxent_grpo import cli
from maxent_grpo.errors import ConfigError, ConfigProblems
from maxent_grpo.recipe import _build_section, parse_recipe, schema
from maxent_grpo.recipe.problems import Problems
from maxent_grpo.recipe.ranges import TRL_CHOICES, UNCHECKED

ACTIONS = {a["dest"]: a for a in schema.load()["methods"]["grpo"]["actions"] if "type" in a}
MAXENT_ACTIONS = {
    a["dest"]: a for a in schema.load()["methods"]["maxent"]["actions"] if "type" in a
}
RANGES = schema.load()["ranges"]  # every declared range (tests/test_key_declarations.py)
CHOICE_KEYS = sorted(k for k, a in ACTIONS.items() if a["choices"])
# Help texts that list a field's values (how TRL documents a str field with a fixed set).
ENUMERATING = re.compile(
    r"must be one of|supported (values|options)|possible (values|choices)|options are", re.I
)


def _enumerated_fields() -> dict[str, dataclasses.Field]:
    """Fields of GRPOConfig (ours, TRL's, transformers') and ModelConfig with a fixed set of
    values: a Literal or Enum type, `choices` metadata, or a help text listing the values."""
    from trl import ModelConfig

    from maxent_grpo.recipe.keys import GRPOConfig

    found = {}
    for section in (GRPOConfig, ModelConfig):
        hints = typing.get_type_hints(section)
        for field in dataclasses.fields(section):
            hint = hints[field.name]
            args = (*typing.get_args(hint), hint)
            enumerated = (
                "Literal" in str(hint)
                or any(isinstance(a, type) and issubclass(a, enum.Enum) for a in args)
                or field.metadata.get("choices")
                or ENUMERATING.search(field.metadata.get("help", ""))
            )
            if enumerated:
                found[field.name] = field
    return found


def test_every_enumerated_field_has_choices_or_is_declared():
    missing = [
        name
        for name in _enumerated_fields()
        if not (ACTIONS.get(name, {}).get("choices") or name in UNCHECKED)
    ]
    assert not missing, f"add to recipe/ranges.py TRL_CHOICES or UNCHECKED: {missing}"


def test_choices_are_the_libraries():
    """TRL_CHOICES lists what TRL documents (its help text) or the library's own constant."""
    import peft

    fields = {f.name: f for f in dataclasses.fields(__import__("trl").GRPOConfig)}
    for key in ("vllm_mode", "loss_type", "multi_objective_aggregation"):
        for choice in TRL_CHOICES[key]:
            assert choice in fields[key].metadata["help"], (key, choice)
    modes = TRL_CHOICES["vllm_importance_sampling_mode"]
    assert all(m in fields["vllm_importance_sampling_mode"].metadata["help"] for m in modes)
    assert set(TRL_CHOICES["lora_task_type"]) <= {t.value for t in peft.TaskType}
    assert set(TRL_CHOICES) <= set(ACTIONS), "a TRL_CHOICES key that is no recipe key"


def test_every_range_names_a_recipe_key():
    assert set(RANGES) <= set(ACTIONS) | set(MAXENT_ACTIONS)


def _one_line(path: Path, key: str, bad) -> str:
    """parse_recipe's error for a recipe with `key: bad`: exactly one line, naming them."""
    with pytest.raises(ConfigError) as info:
        parse_recipe(["--config", str(path)])
    lines = info.value.problems if isinstance(info.value, ConfigProblems) else (str(info.value),)
    assert len(lines) == 1 and "\n" not in lines[0], lines
    line = lines[0]
    assert line.startswith(f"{path}:") and f"key '{key}'" in line and repr(bad) in line, line
    return line


@pytest.mark.parametrize("key", CHOICE_KEYS)
def test_unknown_value_of_an_enumerated_key(key, tmp_path):
    path = write_recipe(tmp_path, **{key: "not-a-choice"})
    assert "expected one of" in _one_line(path, key, "not-a-choice")


def test_unknown_entry_of_a_list_of_choices(tmp_path):
    path = write_recipe(tmp_path, report_to=["wandb", "wandbb"])
    _one_line(path, "report_to", "wandbb")


def _outside(key: str) -> list[int | float]:
    """A value beyond each bound of the key's range, of the key's type."""
    rule = RANGES[key]
    step = 1 if MAXENT_ACTIONS[key]["type"] == "int" else 0.5
    beyond = {">": 0, ">=": -step, "<": 0, "<=": step}
    return [bound + beyond[op] for op, bound in zip(rule[::2], rule[1::2], strict=True)]


RANGE_CASES = [(key, value) for key in sorted(RANGES) for value in _outside(key)]


@pytest.mark.parametrize(("key", "value"), RANGE_CASES)
def test_value_out_of_range(key, value, tmp_path):
    method = {} if key in ACTIONS else {"method": "maxent"}
    path = write_recipe(tmp_path, **method, **{key: value})
    expected = float(value) if MAXENT_ACTIONS[key]["type"] == "float" else value
    assert "is invalid (must be" in _one_line(path, key, expected)


@pytest.mark.parametrize(
    ("keys", "fragment"),
    [
        ({"sync_ref_model": True, "beta": 0.0}, "sync_ref_model"),
        ({"use_peft": True, "lora_target_modules": ["q_proj", "lm_head"]}, "lm_head"),
        (
            {
                "loss_type": "vespo",
                "use_vllm": True,
                "vllm_importance_sampling_correction": True,
                "vllm_importance_sampling_mode": "sequence_mask",
            },
            "vllm_importance_sampling_mode",
        ),
    ],
)
def test_what_the_trainer_refuses_after_loading_is_refused_by_check(
    keys, fragment, tmp_path, tiny_model, capsys, monkeypatch
):
    # use_vllm needs vLLM installed, which `make test` does not assume (test_requirements.py
    # tests that check): only the value's own problem is under test here.
    monkeypatch.setattr("maxent_grpo.launch.launcher.check_installed", lambda *args: None)
    path = write_recipe(tmp_path, model_name_or_path=str(tiny_model), **keys)
    assert cli.main(["check", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}:") and fragment in err[0], err


def test_a_library_exception_while_a_section_is_built_is_one_line():
    @dataclasses.dataclass
    class Section:
        mode: str = "a"

        def __post_init__(self):
            {"a": 1}[self.mode]  # an enum lookup of the library's, say

    problems = Problems("r.yaml")
    assert _build_section(Section, {"mode": "b"}, problems) is None
    assert problems.lines == ["r.yaml: KeyError: b"]
    # A key that already has a problem: its default stands in, the section builds.
    problems.add("r.yaml: key 'mode': 'b' is invalid", ["mode"])
    assert _build_section(Section, {"mode": "b"}, problems) == Section()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("command", "key", "value"),
    [("check", "loss_type", "dpo"), ("check", "top_p", 1.5), ("run", "learning_rate", -1)],
)
def test_real_cli_exits_2_with_one_line(command, key, value, tmp_path):
    """The installed `maxent-grpo` (run: the launcher refuses before starting any process)."""
    path = write_recipe(tmp_path, **{key: value})
    cli_path = str(Path(PYTHON).parent / "maxent-grpo")
    result = subprocess.run(
        [cli_path, command, "--config", str(path)], capture_output=True, text=True, timeout=300
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and f"key '{key}'" in lines[0] and str(path) in lines[0], lines
    assert "Traceback" not in result.stdout + result.stderr
    # Nothing started: at most the launcher's outcome event (user_error) in output_dir.
    events = tmp_path / "out" / "events.jsonl"
    kinds = (
        [json.loads(line)["event"] for line in events.read_text().splitlines()]
        if (events.exists())
        else []
    )
    assert set(kinds) <= {"outcome"} and not list((tmp_path / "out").glob("checkpoint-*"))


def test_the_docs_name_every_checked_key():
    docs = (Path(__file__).parents[1] / "docs" / "recipes.md").read_text()
    section = docs[docs.index("(checked-values)=") : docs.index("(adaptive-kl)=")]
    missing = [key for key in (*TRL_CHOICES, *RANGES) if f"`{key}`" not in section]
    assert not missing, f"docs/recipes.md 'Which values are checked' lacks {missing}"
