"""`maxent-grpo migrate` on recipes of the upstream MaxEnt-GRPO repository (and older open-r1).

tests/fixtures/upstream_maxent/ holds recipes written from upstream's key families
(liv-daliberti/maxent-grpo config/grpo.py, config/dataset.py); each must pass
`check --gpus 8` after one `migrate`, with no hand edit, and `migrate` must say which of its
keys change training. In-process (`cli.main`) from a temporary directory, with a stand-in
vLLM package as in tests/test_migrate.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from helpers.migrating import run_cli
from maxent_grpo.migrate import MIGRATIONS
from maxent_grpo.migrate.engine import behaviour_differences, migrate_text
from maxent_grpo.migrate.rewards import UPSTREAM_REWARDS
from maxent_grpo.migrate.upstream import ORIGIN
from maxent_grpo.migrate.upstream_values import KEPT
from maxent_grpo.recipe.schema import method_keys

FIXTURES = Path(__file__).resolve().parent / "fixtures"
UPSTREAM = sorted((FIXTURES / "upstream_maxent").glob("*.yaml"))
OLDER_OPEN_R1 = sorted((FIXTURES / "open_r1").glob("older_*.yaml"))


@pytest.mark.parametrize("recipe", UPSTREAM + OLDER_OPEN_R1, ids=lambda p: p.stem)
def test_recipe_passes_check_after_one_migrate(recipe, workdir, vllm_installed, capsys):
    code, out, err = run_cli(capsys, "check", "--config", str(recipe), "--gpus", "8")
    assert code != 0, out  # written for upstream / older versions: not valid as it is
    migrated = workdir / recipe.name
    code, out, err = run_cli(capsys, "migrate", str(recipe), "-o", str(migrated), "--gpus", "8")
    assert code == 0, out + err
    assert "still fails check" not in err
    code, out, err = run_cli(capsys, "check", "--config", str(migrated), "--gpus", "8")
    assert code == 0, out + err


def test_every_upstream_fixture_key_has_a_fate_or_is_a_key():
    from maxent_grpo.recipe.schema import method_keys

    accepted = set(method_keys("maxent")) | set(method_keys("grpo")) | {"method", "env"}
    for recipe in UPSTREAM:
        unknown = set(yaml.safe_load(recipe.read_text())) - accepted - set(MIGRATIONS)
        assert not unknown, (recipe.name, unknown)


def test_upstream_keys_of_the_issue_have_their_fate():
    renames = {
        "gen_temperature": "temperature",
        "gen_top_p": "top_p",
        "gen_top_k": "top_k",
        "clip_range": "epsilon",
        "ppo_clip_range": "epsilon",
        "clip_range_high": "epsilon_high",
        "grpo_loss_type": "loss_type",
        "vllm_url": "vllm_server_base_url",
        "vllm_request_timeout": "vllm_server_timeout",
        "dataset_configs": "dataset_config",
    }
    for key, target in renames.items():
        assert MIGRATIONS[key].target == target, key
    for key in ("eval_dataset_name", "eval_reward_funcs", "eval_reward_weights"):
        assert MIGRATIONS[key].action == "fold" and MIGRATIONS[key].target == "benchmarks"
    # built here: keys of ours with upstream's meaning, kept as they are
    kept = {key for key, _ in KEPT}
    assert {"reference_model_name_or_path", "reference_model_revision", "prompt_template"} <= kept
    assert not kept & set(MIGRATIONS)
    assert kept <= set(method_keys("grpo")) and kept <= set(method_keys("maxent"))
    assert set(UPSTREAM_REWARDS) == {
        "pure_accuracy_math",
        "seed_paper_boxed_accuracy_math",
        "seed_paper_answer_tag_accuracy_math",
        "missing_boxed_answer_penalty_math",
        "mbpp_python_tests",
    }


def test_listwise_recipe_becomes_method_maxent_with_its_evaluation_as_a_benchmark():
    text, changes = migrate_text(
        (FIXTURES / "upstream_maxent/maxent_listwise_server.yaml").read_text(), gpus=8
    )
    data = yaml.safe_load(text)
    assert data["method"] == "maxent" and "objective" not in data
    assert data["temperature"] == 1.0 and data["top_p"] == 0.95 and data["top_k"] == 0
    assert data["epsilon"] == 0.2 and data["epsilon_high"] == 0.28
    assert data["vllm_server_timeout"] == 600 and "vllm_server_base_url" not in data
    assert data["log_level"] == "info"
    assert data["eval_strategy"] == "no"
    assert data["benchmarks"] == [
        {
            "name": "MATH-500",
            "dataset": "HuggingFaceH4/MATH-500",
            "split": "test",
            "prompt_column": "problem",
            "answer_column": "answer",
            "reward": "answer_match",
        }
    ]
    # upstream's kl_horizon counted optimizer steps: 500 x (8 x 8 x 7 completions)
    assert data["kl_horizon"] == 500 * 8 * 8 * 7
    # kept: a reference model and a prompt template are built here
    assert data["reference_model_name_or_path"] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert data["prompt_template"] == "{system}\n\nProblem: {prompt}\n"
    differences = "\n".join(behaviour_differences(changes))
    for key in ("reference_model_name_or_path", "prompt_template"):
        assert key not in differences, key
        assert not any(c.key == key for c in changes), key
    for key in (
        "vllm_stop_sequences",
        "kl_ctl_step_size",
        "pure_accuracy_math",
        "eval_dataset_name",
    ):
        assert key in differences, key
    # cosmetic keys are left out without being called a difference
    for key in ("maxent_logprob_chunk_size", "log_like_grpo", "vllm_return_logprobs"):
        assert key not in differences, key
        assert any(c.key == key and c.left_out for c in changes), key


def test_fixed_kl_and_entropy_bonus():
    text, changes = migrate_text(
        (FIXTURES / "upstream_maxent/maxent_entropy_bonus.yaml").read_text(), gpus=8
    )
    data = yaml.safe_load(text)
    assert data["method"] == "grpo" and data["beta"] == 0.04
    assert "kl_target" not in data and "kl_horizon" not in data  # a fixed beta
    assert "# kl_target: 0.0" in text.splitlines()
    assert data["entropy_coef"] == 0.0001  # the reward-side bonus, as TRL's loss-side one
    assert "entropy_normalize_by_max" not in data and "entropy_kl_threshold" not in data
    differences = behaviour_differences(changes)
    assert any(d.startswith("policy_entropy_bonus_coef") and "reward" in d for d in differences)
    assert any("vllm_sync_weights" in d for d in differences)  # upstream never synced
    assert not any(d.startswith("maxent_length_normalize_ref") for d in differences)
    assert not any("info_seed" in d for d in differences)  # off upstream too


def test_entropy_objective_keeps_its_bonus_and_kl_rule():
    """objective maxent_entropy: alpha / ln(vocabulary), scaled by upstream's KL rule
    (train/entropy_kl.py; tests/test_entropy_kl.py trains with it)."""
    source = (FIXTURES / "upstream_maxent/maxent_entropy_kl_adaptive.yaml").read_text()
    data = yaml.safe_load(migrate_text(source, gpus=8)[0])
    assert data["method"] == "grpo"
    expected = dict(
        entropy_coef=0.01,
        entropy_normalize_by_max=True,
        entropy_kl_threshold=0.05,
        entropy_kl_below="raise",
        entropy_kl_above="lower",
        entropy_kl_gain=1.5,
    )
    assert {k: data.get(k) for k in expected} == expected
    assert not any(k.startswith("maxent_alpha") for k in data)
    gated = source.replace(
        "maxent_alpha_lower_on_high_kl: true", "maxent_alpha_disable_outside_trust_zone: true"
    ).replace("beta: 0.04", "beta: 0.0")
    data = yaml.safe_load(migrate_text(gated, gpus=8)[0])
    assert data["entropy_coef"] == 0.01 and "entropy_kl_threshold" not in data  # needs beta


def test_seed_rewards_map_onto_built_ins_with_the_penalty_in_the_weight():
    text, changes = migrate_text(
        (FIXTURES / "upstream_maxent/seed_grpo_dr_grpo.yaml").read_text(), gpus=8
    )
    data = yaml.safe_load(text)
    assert data["reward_funcs"] == ["boxed_accuracy_math", "boxed_missing_penalty"]
    assert data["reward_weights"] == [1.0, 0.05]  # -1 x 0.05 = upstream's -0.05
    assert data["loss_type"] == "dr_grpo"
    assert data["benchmarks"][0]["reward"] == "boxed_accuracy_math"
    assert data["benchmarks"][0]["split"] == "test"
    assert any("seed_grpo_enabled" in d for d in behaviour_differences(changes))
    # clip_range and ppo_clip_range both meant epsilon: the second is left out
    assert text.count("\nepsilon:") == 1


def test_migrate_prints_the_behaviour_differences(tmp_path, workdir, vllm_installed, capsys):
    recipe = FIXTURES / "upstream_maxent/maxent_listwise_server.yaml"
    code, out, err = run_cli(
        capsys, "migrate", str(recipe), "-o", str(tmp_path / "m.yaml"), "--gpus", "8"
    )
    assert code == 0, out + err
    summary = out[out.index("behaviour differences") :]
    assert "kl_ctl_step_size" in summary and "reference_model_name_or_path" not in summary
    assert "maxent_logprob_chunk_size" not in summary


def test_migrating_twice_changes_nothing_more():
    for recipe in UPSTREAM + OLDER_OPEN_R1:
        once, _ = migrate_text(recipe.read_text(), gpus=8)
        twice, changes = migrate_text(once, gpus=8)
        assert twice == once and changes == [], recipe.name


def test_every_upstream_row_says_where_it_comes_from():
    rows = [m for m in MIGRATIONS.values() if m.origin == ORIGIN]
    assert len(rows) >= 100
    assert all(m.why and not m.why.endswith(".") for m in rows)


@pytest.mark.parametrize(
    ("keys", "method"),
    [
        ("objective: maxent_listwise\ntrain_grpo_objective: true\n", "maxent"),
        ("train_grpo_objective: false\nmaxent_objective_variant: entropy\n", "grpo"),
        ("train_grpo_objective: false\n", "maxent"),
        ("objective: something_else\ntrain_grpo_objective: true\n", "grpo"),
    ],
)
def test_upstream_objective_keys_become_one_method_line(keys, method):
    # TRL 1.16: no default of an older TRL is written out (test_era_defaults.py)
    text, changes = migrate_text(keys + "learning_rate: 1.0e-6\n", trl_version="1.16")
    data = yaml.safe_load(text)
    assert data == {"method": method, "learning_rate": 1.0e-6}
    assert [line for line in text.splitlines() if line.startswith("method:")] == [
        f"method: {method}"
    ]
    assert len(changes) == keys.count("\n")


def test_check_for_gpus_on_a_machine_without_them_notes_what_the_job_installs(
    workdir, monkeypatch, capsys
):
    """Issue 27 item 4: `check --gpus 8` on a login node (no GPU, no vLLM) checks the recipe
    and names the packages the job's environment installs; without --gpus it stays strict."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    recipe = workdir / "r.yaml"
    recipe.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\ndataset_name: org/data\n"
        "use_vllm: true\nvllm_mode: server\nnum_generations: 7\n"
        "per_device_train_batch_size: 7\noutput_dir: out\n"
    )
    code, out, err = run_cli(capsys, "check", "--config", str(recipe), "--gpus", "8")
    assert code == 0, out + err
    assert f"note: {recipe}: this machine lacks vllm (vllm_mode: server)" in out
    assert "the job's environment installs it" in out
    code, out, err = run_cli(capsys, "check", "--config", str(recipe))
    assert code == 2 and "lacks; install it with" in err


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        ("gradient_accumulation_steps: 7\n", {"gradient_accumulation_steps": 6}),
        ("gradient_accumulation_steps: 8\n", {"num_processes": 6}),
    ],
)
def test_upstream_batch_keys_are_fitted_to_the_planned_processes(
    batch, expected, workdir, vllm_installed, capsys
):
    """Issue 42 item 3: upstream trained on 6 processes (server on GPU 0, GPUs 1-6); its keys
    for 4 x 6 x GA completions in groups of 12 do not divide on 7 (8 GPUs, one serves)."""
    source = (FIXTURES / "upstream_maxent/maxent_entropy_bonus.yaml").read_text()
    source = source.replace("gradient_accumulation_steps: 32\n", batch)
    source = source.replace("num_generations: 4\n", "num_generations: 12\n")
    recipe = workdir / "held_out.yaml"
    recipe.write_text(source)
    code, _, err = run_cli(capsys, "check", "--config", str(recipe), "--gpus", "8")
    assert code != 0
    migrated = workdir / "migrated.yaml"
    code, out, err = run_cli(capsys, "migrate", str(recipe), "-o", str(migrated), "--gpus", "8")
    assert code == 0, out + err
    data = yaml.safe_load(migrated.read_text())
    for key, value in expected.items():
        assert data[key] == value, key
    per_step = data["per_device_train_batch_size"] * data["gradient_accumulation_steps"]
    processes = data.get("num_processes", 7)
    assert per_step * processes == 4 * 6 * int(batch.split(": ")[1])  # upstream's per step
    assert f"{processes} training process(es)" in out


def test_top_k_minus_one_and_research_keys_get_todays_spelling_or_a_note():
    """-1 (vLLM's top-k off) is 0 in TRL 1.16 under both upstream names; research keys are left
    out with what differs (pass@8, stop strings, truncated rewards)."""
    source = FIXTURES / "upstream_maxent" / "paper_r1_research_keys.yaml"
    text, changes = migrate_text(source.read_text(), str(source))
    data = yaml.safe_load(text)
    assert data["top_k"] == 0 and "gen_top_k" not in data and "vllm_top_k" not in data
    left = {c.key for c in changes if c.left_out}
    research = {"vllm_include_stop_str_in_output", "zero_truncated_completion_rewards"}
    assert research | {"rich_log_completions", "seed_paper_eval_pass_at_8_samples"} <= left
    differs = " ".join(behaviour_differences(changes))
    assert "seed_paper_eval_pass_at_8_enabled" in differs and "num_samples: 8, k: 8" in differs
    assert "zero_truncated_completion_rewards" in differs


def test_the_evaluation_batch_is_refit_to_the_planned_processes():
    source = FIXTURES / "open_r1" / "full_eval_on_7_trainers.yaml"
    text, changes = migrate_text(source.read_text(), str(source), gpus=8)
    assert yaml.safe_load(text)["per_device_eval_batch_size"] == 8  # 8 x 7 = 56: whole groups
    (line,) = [c.text for c in changes if c.key == "per_device_eval_batch_size"]
    assert "no exact fit: 28 completions per evaluation batch" in line and "8 x 7 = 56" in line
    text, _ = migrate_text(source.read_text(), str(source))  # no plan: left as written
    assert yaml.safe_load(text)["per_device_eval_batch_size"] == 4


def test_a_training_batch_without_whole_groups_gets_the_nearest_and_why():
    """1 x 6 trainers x 2 = 12 completions per step are no whole group of 16: the step keeps 12,
    a generation grows to the nearest whole groups (48), and the change says so."""
    recipe = (
        "objective: grpo\nmodel_name_or_path: m\nuse_vllm: true\nvllm_mode: server\n"
        "vllm_tensor_parallel_size: 2\nper_device_train_batch_size: 1\n"
        "gradient_accumulation_steps: 2\nnum_generations: 16\noutput_dir: o\n"
    )
    text, changes = migrate_text(recipe, "r.yaml", gpus=8)
    data = yaml.safe_load(text)
    assert (data["per_device_train_batch_size"], data["gradient_accumulation_steps"]) == (1, 2)
    assert data["steps_per_generation"] == 8 and (1 * 6 * 8) % 16 == 0
    (change,) = [c for c in changes if c.key == "steps_per_generation"]
    assert change.differs and "no exact fit: 12 completions per optimizer step" in change.text
    assert "1 x 6 x 8 = 48 per generation (source 12)" in change.text
