"""`maxent-grpo rehearse`'s decisions, pure (launch/plan/rehearse.py): the shrink of a recipe to
this machine, and the passport's rows from recorded results (the real rehearsals:
tests/test_rehearse.py, marker `rehearse`)."""

from __future__ import annotations

from pathlib import Path

import yaml

from maxent_grpo.launch.plan.rehearse import (
    COMPLETION_CAP,
    PROBE,
    TRAINERS,
    Node,
    exit_code,
    passport,
    shrink,
    table,
)

REPO = Path(__file__).resolve().parents[1]
MATH = REPO / "recipes/Qwen2.5-1.5B-Instruct/grpo/config_math.yaml"
NODE = Node(tiny_model="/m/tiny", vllm=True, hub=False)


def _math():
    return yaml.safe_load(MATH.read_text())


def test_the_gpu_recipe_shrinks_to_two_cpu_trainers_and_a_cpu_server_each_change_said():
    values = _math()
    shrunk = shrink(values, NODE, steps=4)
    out = shrunk.values
    assert out["model_name_or_path"] == "/m/tiny" and out["dtype"] == "float32"
    assert out["num_processes"] == TRAINERS and "accelerate_config" not in out
    assert out["use_vllm"] and out["vllm_server_device"] == "cpu"
    assert out["vllm_weight_sync"] == "disk"  # NCCL needs CUDA
    assert out["max_completion_length"] == COMPLETION_CAP and out["max_steps"] == 4
    assert out["dataset_name"] == "builtin:arithmetic"  # the hub is out of reach
    assert out["reward_funcs"] == [*values["reward_funcs"], PROBE]
    assert out["reward_weights"] == [*values["reward_weights"], 1.0]
    # TRL's rule on 2 processes: per-device batch x 2 x accumulation divides into groups
    batch, acc = out["per_device_train_batch_size"], out["gradient_accumulation_steps"]
    assert (batch * TRAINERS * acc) % out["num_generations"] == 0
    # everything else is the recipe's, untouched
    for key in ("reward_funcs", "temperature", "loss_type", "learning_rate", "system_prompt"):
        assert values[key] == out[key] or key == "reward_funcs"
    said = "\n".join(shrunk.changes)
    for key in ("model_name_or_path", "vllm_weight_sync", "max_completion_length", "dataset_name"):
        assert f"{key}: " in said
    assert all(line.count("\n") == 0 for line in shrunk.changes)
    assert values == _math()  # the input is not changed


def test_without_vllm_generation_moves_into_the_trainers_and_a_reachable_hub_is_kept():
    shrunk = shrink(_math(), Node("/m/tiny", vllm=False, hub=True), steps=4)
    assert shrunk.values["use_vllm"] is False
    assert shrunk.values["dataset_name"] == _math()["dataset_name"]
    assert any("no vLLM CPU server here" in line for line in shrunk.changes)


def test_tools_keep_a_longer_episode_and_the_recipes_chat_template():
    values = {"tools": ["python"], "max_completion_length": 2048, "chat_template": "{{ x }}"}
    shrunk = shrink(values, NODE, steps=3)
    assert shrunk.values["max_completion_length"] == 96
    assert shrunk.values["chat_template"] == "{{ x }}"
    assert any(line.startswith("chat_template:") for line in shrunk.changes)


def test_tools_without_a_chat_template_get_one_that_renders_tool_calls():
    node = Node("/m/tiny", vllm=False, hub=False, tool_template="{{ tools }}")
    shrunk = shrink({"tools": ["python"]}, node, steps=3)
    assert shrunk.values["chat_template"] == "{{ tools }}"
    assert any("qwen2_5.jinja" in line for line in shrunk.changes)
    assert "chat_template" not in shrink({}, node, steps=3).values


def _record(**over):
    record = {
        "check": {"verdict": "valid for 7 training process(es) on gpu"},
        "rewards": {
            "probe": {"accuracy": dict(rows=8, calls=80, failures=0, distinct=2, value=None)},
            "training_failures": {},
            "spread": {"accuracy": False},
            "zero_std": [1.0, 0.5],
        },
        "prompts": {"rows": 64, "tokenizer": "t", "longest": 50, "limit": 100, "over": 0},
        "resume": {
            "stop_code": 85,
            "saved_step": 2,
            "first_resumed_step": 3,
            "pieces_saved": ["kl_controller"],
            "pieces_restored": ["kl_controller"],
            "draws_uninterrupted": {"2": {"0": ["a", "b"]}, "3": {"0": ["c"]}},
            "draws_resumed": {"2": {"0": ["a", "b"]}, "3": {"0": ["c"]}},
        },
        "rundir": {"output_dir": "o", "found": {"events.jsonl": True, "runs line": True}},
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            record[section] = {**record[section], field: value}
        else:
            record[section] = value
    return record


def _failing(record) -> list:
    rows = passport(record)
    return [row for row in rows if row.ok is False]


def test_a_clean_record_passes_every_row():
    rows = passport(_record())
    assert exit_code(rows) == 0, table(rows)
    assert {r.name for r in rows} >= {"check", "reward accuracy", "prompts fit", "run directory"}


def _probe(**seen):
    base = dict(rows=8, calls=80, failures=0, distinct=2, value=None)
    return {"probe": {"bad": {**base, **seen}}}


def test_each_broken_result_fails_its_row_with_one_line_and_a_non_zero_exit():
    cases = {
        "reward bad": _record(rewards={**_probe(failures=3, first_error="KeyError: 'x'")}),
        "reward bad ": _record(rewards={**_probe(), "training_failures": {"bad": 2}}),
        "constant": _record(
            rewards={"probe": {"bad": dict(rows=8, calls=8, failures=0, distinct=1, value=1.0)}}
        ),
        "prompts fit": _record(prompts__over=3),
        "resume at saved step + 1": _record(resume__first_resumed_step=1),
        "state pieces back": _record(resume__pieces_restored=None),
        "same prompts, same order": _record(
            resume__draws_resumed={"2": {"0": ["b", "a"]}, "3": {"0": ["c"]}}
        ),
        "run directory": _record(rundir={"output_dir": "o", "found": {"runs line": False}}),
        "check": _record(check={"error": "r.yaml: reward_funcs: unknown 'x'"}),
        "tools": _record(tools={"names": ["m:f"], "error": "m:f: cannot import m"}),
    }
    for what, record in cases.items():
        failing = _failing(record)
        assert len(failing) == 1, (what, failing)
        row = failing[0]
        assert row.fix and "\n" not in row.fix, row
        assert exit_code(passport(record)) == 1
        assert f"fix: {row.name}: {row.fix}" in table(passport(record))
    constant = _failing(cases["constant"])[0]
    assert "carries no signal" in constant.fix and "1.0" in constant.fix


def test_a_constant_probe_passes_when_training_saw_spread_and_the_share_is_a_figure():
    record = _record(rewards={**_probe(distinct=1, value=0.0), "spread": {"bad": True}})
    assert exit_code(passport(record)) == 0
    record = _record(rewards={**_probe(), "zero_std": [1.0, 0.5]})
    (row,) = [r for r in passport(record) if r.name == "groups without reward spread"]
    assert row.ok is None and row.seen.startswith("75% over 2 steps")


def test_the_weight_push_row():
    good = {"syncs": 3, "max_logp_diff": [1e-6, 2e-6, 1e-6], "tolerance": 1e-3}
    assert exit_code(passport(_record(push=good))) == 0
    bad = {**good, "max_logp_diff": [1e-6, 0.5, 1e-6]}
    (row,) = _failing(_record(push=bad))
    assert row.name == "weight push landed" and "[2]" in row.fix
    skipped = passport(_record(push={"skipped": "not run: no vLLM"}))
    assert [r.ok for r in skipped if r.name == "weight push landed"] == [None]
