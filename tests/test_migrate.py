"""`maxent-grpo migrate` and the migration table, on open-r1-style recipes (tests/fixtures/open_r1).

Every fixture is checked for an 8-GPU node (`--gpus 8`) as it is and after `migrate`; all of them
must pass after `migrate` with no hand edit. The commands run in-process (`cli.main`), from a
temporary directory (the recipes' output_dir is relative). This machine has no vLLM: the
recipes ask for it, so a stand-in package (a module and its metadata, nothing importable
behind them) is put on sys.path, as a cluster environment would have the real one.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.migrating import run_cli
from maxent_grpo.methods import RL_METHODS
from maxent_grpo.migrate import ALIASES, MIGRATIONS, VALUE_CHANGES
from maxent_grpo.migrate.edits import MARK
from maxent_grpo.migrate.engine import migrate_text
from maxent_grpo.migrate.open_r1 import DEFAULT_CHANGES, UNCHANGED_KEYS

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "open_r1"
RECIPES = sorted(FIXTURES.glob("*.yaml"))
# The one fixture already written for TRL 1.16 (dtype, warmup_steps, vllm_mode: server).
PASSES_AS_IS = {"eval_on_7plus1.yaml"}


def test_there_are_at_least_12_open_r1_style_recipes():
    assert len(RECIPES) >= 12
    text = {path.name: path.read_text() for path in RECIPES}
    # demo, code, IOI and Codeforces styles, and an upstream MaxEnt-style GRPO recipe
    assert any("ioi_code" in t for t in text.values())
    assert any("cf_code" in t for t in text.values())
    assert any("code_provider: e2b" in t for t in text.values())
    assert any("kl_horizon" in t and "method:" not in t for t in text.values())


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_passes_check_after_migrate(recipe, workdir, vllm_installed, capsys):
    code, out, err = run_cli(capsys, "check", "--config", str(recipe), "--gpus", "8")
    assert (code == 0) == (recipe.name in PASSES_AS_IS), out + err
    if code:
        # every problem at once, one line each, then the count
        lines = err.strip().splitlines()
        assert lines[-1].endswith(f"problems in {recipe}") or len(lines) == 1, err
        assert all(line.startswith("error: ") for line in lines[:-1]), err

    migrated = workdir / recipe.name
    code, out, err = run_cli(capsys, "migrate", str(recipe), "-o", str(migrated), "--gpus", "8")
    assert code == 0, out + err
    # 7 + 1 GPUs (vLLM server) unless the recipe colocates vLLM with training on all 8
    processes = 8 if "vllm_mode: colocate" in recipe.read_text() else 7
    assert f"ok: {migrated} is valid for {processes} training process(es) on gpu" in out, out
    code, out, err = run_cli(capsys, "check", "--config", str(migrated), "--gpus", "8")
    assert code == 0, out + err


def test_migrate_keeps_every_comment_and_marks_every_change():
    source = FIXTURES / "qwen25_15b_instruct_demo.yaml"
    original = source.read_text()
    text, changes = migrate_text(original, str(source))
    lines = text.splitlines()
    for line in original.splitlines():
        if line.lstrip().startswith("#") or "#" in line.split(":", 1)[-1]:
            assert line in lines, f"comment lost: {line!r}"
    marks = [line for line in lines if line.startswith(MARK)]
    # 8 translations (+ dataset_test_split: test, eval on), flash_attention_2 -> sdpa (no
    # flash-attn here), 6 defaults of TRL 0.17 (vllm_device dates it; test_era_defaults.py)
    assert len(marks) == len(changes) == 15
    assert f"{MARK} torch_dtype -> dtype (transformers 5: renamed to dtype" in text
    assert "# overwrite_output_dir: true" in lines  # left out: commented out, not lost
    data = yaml.safe_load(text)
    assert data["dtype"] == "bfloat16" and "torch_dtype" not in data
    assert data["warmup_steps"] == 0.1 and "warmup_ratio" not in data
    assert data["vllm_mode"] == "server"
    assert data["vllm_server_gpu_memory_utilization"] == 0.7
    assert "vllm_gpu_memory_utilization" not in data
    for gone in ("max_prompt_length", "overwrite_output_dir", "vllm_device"):
        assert gone not in data
    left_out = {c.key for c in changes if c.left_out}
    assert left_out == {"max_prompt_length", "overwrite_output_dir", "vllm_device"}


def test_migrate_translates_judged_rewards_providers_and_lighteval_benchmarks():
    ioi, _ = migrate_text((FIXTURES / "qwen25_7b_ioi.yaml").read_text())
    data = yaml.safe_load(ioi)
    assert data["reward_funcs"] == ["code_format", "format"]
    assert data["reward_weights"] == [0.1, 0.1]
    assert "code_language" not in data  # cpp: the sandbox runs Python only
    code, changes = migrate_text((FIXTURES / "qwen25_coder_7b_code.yaml").read_text())
    assert yaml.safe_load(code)["code_provider"] == "local"
    assert "e2b_router_url" not in yaml.safe_load(code)
    demo, changes = migrate_text((FIXTURES / "deepseek_distill_15b_demo.yaml").read_text())
    data = yaml.safe_load(demo)
    assert "benchmarks" not in data and "callbacks" not in data
    assert data["hub_revision"] == "v01.00-step-000000"
    assert {"benchmarks", "callbacks", "push_to_hub_revision"} <= {
        c.key for c in changes if c.left_out
    }


def test_migrate_adds_open_r1_defaults_only_where_they_differ():
    dapo, _ = migrate_text((FIXTURES / "dapo_style_liger.yaml").read_text())
    assert yaml.safe_load(dapo)["dataset_prompt_column"] == "prompt"
    colocate, changes = migrate_text((FIXTURES / "qwen3_demo_colocate.yaml").read_text())
    data = yaml.safe_load(colocate)
    assert data["vllm_mode"] == "colocate" and data["vllm_gpu_memory_utilization"] == 0.3
    assert "vllm_mode" not in {c.key for c in changes}


def test_migrating_twice_changes_nothing_more():
    for recipe in RECIPES:
        once, _ = migrate_text(recipe.read_text())
        twice, changes = migrate_text(once)
        assert twice == once and changes == [], recipe.name


def test_migrate_exits_non_zero_only_when_the_result_still_fails_check(tmp_path, workdir, capsys):
    recipe = tmp_path / "typo.yaml"
    recipe.write_text(
        "# my recipe\nmodel_name_or_path: Qwen/Qwen2.5-0.5B\ntorch_dtype: float32\n"
        "num_generatoins: 4\noutput_dir: out\n"
    )
    out_file = tmp_path / "migrated.yaml"
    code, out, err = run_cli(capsys, "migrate", str(recipe), "-o", str(out_file))
    assert code == 2
    assert "changed: torch_dtype -> dtype" in out
    assert "unknown key 'num_generatoins'; did you mean 'num_generations'" in err
    assert f"{out_file} still fails check" in err
    assert out_file.read_text().startswith("# my recipe\n")


def _accepted_keys() -> dict[str, set[str]]:
    from maxent_grpo.recipe.schema import trl_parser
    from maxent_grpo.recipe.sections import SECTIONS

    return {
        name: {a.dest for a in trl_parser(types)._actions} - {"help"}
        for name, types in SECTIONS.items()
    }


def test_the_table_agrees_with_the_pinned_versions():
    """Every target is a key of every method that generates (SFT has no generation keys: a
    migrated GRPO key in an SFT recipe is then refused in one line); every key the table
    moves is a key of no method."""
    accepted = _accepted_keys()
    for method in set(accepted) - set(RL_METHODS):
        assert not {m.key for m in MIGRATIONS.values()} & accepted[method], method
    for method in RL_METHODS:
        keys = accepted[method]
        for migration in MIGRATIONS.values():
            assert migration.key not in keys, (method, migration.key)
            if migration.action != "remove":
                # `method` is read before the sections (recipe/parser.py)
                assert migration.target in keys | {"method"}, (method, migration.target)
        for rule in (*DEFAULT_CHANGES, *VALUE_CHANGES):
            # the MaxEnt-only rules (upstream's tau bounds) are keys of method maxent only
            assert rule.key in keys or rule.key.startswith("maxent_"), (method, rule.key)
            assert rule.key in accepted["maxent"], rule.key
        unchanged = set(UNCHANGED_KEYS) - keys
        assert not unchanged, (method, unchanged)
    assert ALIASES == {"dataset_solution_column": "dataset_answer_column"}


def test_the_docs_page_is_generated_from_the_table():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "_ext"))
    import migration_reference

    page = migration_reference.render_migrations() + migration_reference.render_upstream()
    for key in (*MIGRATIONS, *(rule.key for rule in (*DEFAULT_CHANGES, *VALUE_CHANGES))):
        assert f"``{key}``" in page, key
    assert "``ioi_code``" in page and "``cf_code``" in page


def test_every_fixture_key_is_a_key_or_in_the_table():
    accepted = _accepted_keys()["maxent"] | {"method", "env"}
    for recipe in RECIPES:
        unknown = set(yaml.safe_load(recipe.read_text())) - accepted - set(MIGRATIONS)
        assert not unknown, (recipe.name, unknown)


def test_a_conversion_without_counterpart_is_left_out():
    text, changes = migrate_text("warmup_ratio: 1.0\nlearning_rate: 1.0e-6\n")
    assert "# warmup_ratio: 1.0" in text.splitlines()
    (change,) = changes
    assert change.left_out and "not a fraction below 1" in change.text
    assert dataclasses.replace(change, left_out=False).describe() == change.text


def test_the_parsers_old_keys_are_the_migration_tables_and_reading_imports_no_migrate(tmp_path):
    """recipe/old_keys.json is written from migrate/'s table (stale: this fails); reading a
    recipe with an old key names its fix from that file, with migrate/ never imported."""
    from maxent_grpo.migrate.table import main

    assert main([]) == 0, "run: python -m maxent_grpo.migrate.table --write"
    recipe = tmp_path / "old.yaml"
    recipe.write_text("torch_dtype: float32\noutput_dir: o\n")
    code = (
        "import sys\n"
        "from maxent_grpo.errors import ConfigError\n"
        "from maxent_grpo.recipe import read_recipe\n"
        "try:\n"
        f"    read_recipe(['--config', {str(recipe)!r}], 'grpo')\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
        "print(sorted(m for m in sys.modules if m.startswith('maxent_grpo.migrate')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "key 'torch_dtype' (transformers 5): renamed to dtype" in out.stdout, out.stdout
    assert out.stdout.strip().endswith("[]"), out.stdout
