"""Defaults by era (migrate/era.py): `migrate` dates a recipe's TRL (its source, its
keys, `--trl-version`) and writes out, with their old values, the defaults that changed since;
old values with no meaning today (top_k: -1) are translated."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from helpers.migrating import run_cli
from maxent_grpo.errors import ConfigError
from maxent_grpo.migrate.engine import default_drift, migrate_text
from maxent_grpo.migrate.era import ERA_DEFAULTS, LAST_WITH_KEY

FIXTURES = Path(__file__).resolve().parent / "fixtures"
DEMO = FIXTURES / "open_r1" / "qwen25_15b_instruct_demo.yaml"  # open-r1's config_demo.yaml
UPSTREAM_GRPO = FIXTURES / "upstream_maxent" / "grpo_math_baseline.yaml"


def pinned(text: str, changes) -> dict:
    data = yaml.safe_load(text)
    return {c.key: data[c.key] for c in changes if c.pinned}


def test_open_r1_demo_is_dated_by_vllm_device_and_keeps_trl_0_17_defaults():
    text, changes = migrate_text(DEMO.read_text())
    assert pinned(text, changes) == {
        "loss_type": "bnpo",
        "beta": 0.04,
        "temperature": 0.9,
        "top_k": 50,
        "vllm_importance_sampling_correction": False,
        "use_bias_correction_kl": False,  # beta 0.04 > 0
    }
    drift = default_drift(changes)
    assert all("default of TRL 0.17.0, dated by vllm_device" in line for line in drift)
    assert any(line.startswith("loss_type: bnpo added") and "dapo" in line for line in drift)
    # the demo sets max_completion_length and bf16 itself: nothing to pin
    assert not {"max_completion_length", "bf16"} & {c.key for c in changes if c.pinned}


def test_an_upstream_recipe_keeps_the_defaults_of_upstreams_trl_0_18():
    text, changes = migrate_text(UPSTREAM_GRPO.read_text(), gpus=8)
    drift = default_drift(changes)
    assert drift and all("default of TRL 0.18.0, upstream MaxEnt-GRPO's pin" in d for d in drift)
    keys = pinned(text, changes)
    source = yaml.safe_load(UPSTREAM_GRPO.read_text())
    # temperature and top_k changed in 0.18: 0.18 itself had today's sampling defaults
    assert "temperature" not in keys and "top_k" not in keys
    assert keys.get("loss_type", "set") in ("bnpo", "set")
    if "max_completion_length" not in source:
        assert keys["max_completion_length"] == 256


@pytest.mark.parametrize(
    ("version", "extra", "expected"),
    [
        # before 0.16 TRL sent vLLM temperature and max_tokens only: top-k stayed off there
        ("0.14", "", {"loss_type": "grpo", "beta": 0.04, "temperature": 0.9, "top_k": 50}),
        ("0.15.1", "use_vllm: true\n", {"loss_type": "grpo", "temperature": 0.9}),
        ("v0.21.0", "", {"loss_type": "bnpo"}),
        ("1.9", "", {"max_completion_length": 256}),
        ("1.16.0", "", {}),
    ],
)
def test_trl_version_decides_which_defaults_are_written_out(version, extra, expected):
    recipe = "model_name_or_path: m\nmax_completion_length: 64\nbf16: true\n" + extra
    if version == "1.9":
        recipe = "model_name_or_path: m\n"
    text, changes = migrate_text(recipe, trl_version=version)
    keys = pinned(text, changes)
    assert {k: keys[k] for k in expected} == expected
    assert set(keys) - set(expected) <= {
        "beta",
        "use_bias_correction_kl",
        "vllm_importance_sampling_correction",
        "bf16",
    }
    if version.startswith("1.16"):
        assert keys == {}


def test_a_key_the_recipe_sets_is_never_pinned_and_maxent_keeps_its_own_loss():
    text, changes = migrate_text("loss_type: dr_grpo\nbeta: 0.0\n", trl_version="0.14")
    assert "loss_type" not in pinned(text, changes) and "beta" not in pinned(text, changes)
    assert "use_bias_correction_kl" not in pinned(text, changes)  # beta 0: no KL term
    text, changes = migrate_text("method: maxent\n", trl_version="0.14")
    assert not {"loss_type", "beta", "use_bias_correction_kl"} & set(pinned(text, changes))


def test_a_bad_trl_version_is_one_line():
    with pytest.raises(ConfigError, match=r"--trl-version 'newest': give a release number"):
        migrate_text("beta: 0.0\n", trl_version="newest")


def test_old_values_with_no_meaning_today_are_translated():
    text, changes = migrate_text("top_k: -1\nzero3_save_16bit_model: true\n", trl_version="1.16")
    data = yaml.safe_load(text)
    assert data == {"top_k": 0}
    (top_k,) = [c for c in changes if c.key == "top_k"]
    assert "top_k: -1 -> 0" in top_k.text
    (zero3,) = [c for c in changes if c.key == "zero3_save_16bit_model"]
    assert zero3.left_out and "recipes/accelerate_configs/zero3.yaml" in zero3.text


def test_each_row_states_todays_default_and_names_a_key_of_both_methods():
    """`now` is the installed TRL's default (a TRL upgrade that changes one fails here)."""
    from maxent_grpo.recipe.schema import default, method_keys

    for row in ERA_DEFAULTS:
        # bf16's field default is None, which TRL's __post_init__ makes true unless fp16
        assert default(row.key) == (None if row.key == "bf16" else row.now), row.key
        assert row.key in method_keys("grpo"), row.key
    for key in LAST_WITH_KEY:
        assert key not in method_keys("grpo"), key  # gone today, so it dates a recipe


def test_migrate_prints_the_drift_and_the_result_passes_check(
    workdir, vllm_installed, monkeypatch, capsys
):
    out_file = workdir / "demo.yaml"
    code, out, err = run_cli(capsys, "migrate", str(DEMO), "-o", str(out_file), "--gpus", "8")
    assert code == 0, out + err
    section = out[out.index("defaults that changed since") :]
    assert "  - loss_type: bnpo added" in section and "  - beta: 0.04 added" in section
    code, out, err = run_cli(
        capsys, "migrate", str(DEMO), "-o", str(out_file), "--gpus", "8", "--trl-version", "9.0"
    )
    assert code == 0, out + err
    assert "defaults that changed since" not in out


def test_pins_are_changes_of_their_own_kind():
    _, changes = migrate_text(DEMO.read_text())
    for change in changes:
        assert not (change.pinned and (change.differs or change.left_out)), change
    plain = [dataclasses.replace(c, pinned=False) for c in changes]
    assert default_drift(plain) == []
