"""Tests for maxent_grpo.data: builtin datasets, local files, mixtures, errors. No network."""

from __future__ import annotations

import ast
import dataclasses
import json
import operator
import time

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maxent_grpo import data
from maxent_grpo.data import DataError, DatasetMixture, MixtureEntry
from maxent_grpo.recipe.keys import ScriptArguments


@pytest.fixture(autouse=True)
def _offline_cache(tmp_path, monkeypatch):
    """Keep the `datasets` cache per test and fail fast if anything tries the hub."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


def make_args(**overrides):
    """The recipe's data keys: ScriptArguments' defaults (few generated rows), then overrides."""
    return dataclasses.replace(ScriptArguments(), **{"dataset_num_rows": 64, **overrides})


ROWS = [{"problem": f"What is {i} + 1?", "solution": i + 1, "level": i % 3} for i in range(10)]


def write_rows(path, rows=ROWS):
    """Write rows as .jsonl / .json / .parquet / .csv depending on the suffix."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        header = ",".join(rows[0])
        path.write_text("\n".join([header] + [",".join(str(v) for v in r.values()) for r in rows]))
    return path


# ---------------------------------------------------------------------------------------------
# builtin datasets
# ---------------------------------------------------------------------------------------------

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def safe_eval(expr: str) -> int:
    """Evaluate +, -, * over non-negative int literals; anything else fails the test."""

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            return node.value
        raise AssertionError(f"unexpected syntax in {expr!r}: {ast.dump(node)}")

    return ev(ast.parse(expr, mode="eval"))


@pytest.mark.parametrize("name", data.BUILTIN_NAMES)
def test_builtin_is_deterministic_by_seed(name):
    a = data.builtin_dataset(name, num_rows=200, seed=1)
    assert a.column_names == ["problem", "solution"]
    assert len(a) == 200
    assert a.to_dict() == data.builtin_dataset(name, num_rows=200, seed=1).to_dict()
    assert a["problem"] != data.builtin_dataset(name, num_rows=200, seed=2)["problem"]


def test_arithmetic_answers_are_exact():
    ds = data.builtin_dataset("arithmetic", num_rows=2000, seed=3)
    saw_parens = saw_mul = False
    for problem, solution in zip(ds["problem"], ds["solution"]):
        assert problem.startswith("What is ") and problem.endswith("?")
        expr = problem[len("What is ") : -1]
        saw_parens |= "(" in expr
        saw_mul |= "*" in expr
        assert solution == str(safe_eval(expr)), problem
        assert int(solution) >= 0
    assert saw_parens and saw_mul


def test_word_problems_have_nonnegative_int_answers():
    ds = data.builtin_dataset("word_problems", num_rows=1000, seed=0)
    for solution in ds["solution"]:
        assert solution.isdigit() and str(int(solution)) == solution
    text = " ".join(ds["problem"])
    for word in ("apples", "train", "pencils", "cookies"):
        assert word in text


def test_mixed_contains_both_kinds():
    problems = data.builtin_dataset("mixed", num_rows=200, seed=0)["problem"]
    arithmetic = sum(p.startswith("What is ") for p in problems)
    assert 40 < arithmetic < 160


def test_builtin_is_fast():
    start = time.perf_counter()
    data.builtin_dataset("mixed", num_rows=4096, seed=0)
    # Idle: about 0.1 s; a slow path (a library call per row) takes minutes. Loose for load.
    assert time.perf_counter() - start < 5.0


def test_builtin_errors():
    with pytest.raises(DataError, match="builtin:arithmetic"):
        data.builtin_dataset("algebra", num_rows=8, seed=0)
    with pytest.raises(DataError, match="dataset_num_rows"):
        data.builtin_dataset("arithmetic", num_rows=0, seed=0)


def test_load_builtin_by_name():
    args = make_args(dataset_name="builtin:word_problems", dataset_num_rows=32, dataset_seed=5)
    dd = data.load_datasets(args)
    assert list(dd) == ["train"]
    assert len(dd["train"]) == 32
    assert set(dd["train"].column_names) == {"prompt", "solution"}
    raw = data.builtin_dataset("word_problems", num_rows=32, seed=5)
    assert dd["train"][0]["prompt"] == [{"role": "user", "content": raw[0]["problem"]}]
    assert dd["train"]["solution"] == raw["solution"]


# ---------------------------------------------------------------------------------------------
# local files and conversion
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".csv"])
def test_local_files_load_and_convert(tmp_path, suffix):
    path = write_rows(tmp_path / f"rows{suffix}")
    dd = data.load_datasets(make_args(dataset_name=str(path)))
    train = dd["train"]
    assert len(train) == 10
    assert set(train.column_names) == {"prompt", "solution", "level"}
    assert train[3]["prompt"] == [{"role": "user", "content": "What is 3 + 1?"}]
    assert train[3]["solution"] == "4"
    assert train.features["solution"] == datasets.Value("string")


def test_local_directory(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    write_rows(folder / "a.jsonl", ROWS[:4])
    write_rows(folder / "b.jsonl", ROWS[4:])
    (folder / "README.md").write_text("ignored")
    dd = data.load_datasets(make_args(dataset_name=str(folder)))
    assert len(dd["train"]) == 10


def test_system_prompt_present_and_absent(tmp_path):
    path = str(write_rows(tmp_path / "rows.jsonl"))
    with_system = data.load_datasets(make_args(dataset_name=path, system_prompt="Think."))
    assert with_system["train"][0]["prompt"] == [
        {"role": "system", "content": "Think."},
        {"role": "user", "content": "What is 0 + 1?"},
    ]
    without = data.load_datasets(make_args(dataset_name=path))
    assert [m["role"] for m in without["train"][0]["prompt"]] == ["user"]


def test_custom_columns_and_no_answer(tmp_path):
    rows = [{"question": "Q?", "answer": 7, "solution": "old"}]
    path = str(write_rows(tmp_path / "qa.jsonl", rows))
    args = make_args(dataset_name=path, dataset_prompt_column="question")
    args.dataset_answer_column = "answer"
    row = data.load_datasets(args)["train"][0]
    assert row == {"answer": 7, "prompt": [{"role": "user", "content": "Q?"}], "solution": "7"}
    args.dataset_answer_column = None
    row = data.load_datasets(args)["train"][0]
    assert row["solution"] == "old" and "question" not in row


def test_to_conversation_keeps_message_lists():
    ds = datasets.Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": "hi"}]], "solution": [3]}
    )
    out = data.to_conversation(ds, "prompt", "solution", "sys")
    assert out[0]["prompt"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
    ]
    assert out[0]["solution"] == "3"


def test_null_prompt_row_is_a_data_error():
    ds = datasets.Dataset.from_dict({"problem": ["ok", None], "solution": ["1", "2"]})
    with pytest.raises(DataError, match="row 1"):
        data.to_conversation(ds, "problem", "solution", None)


def test_missing_column_lists_available_columns(tmp_path):
    path = str(write_rows(tmp_path / "rows.jsonl"))
    args = make_args(dataset_name=path, dataset_prompt_column="question")
    for check in (data.load_datasets, data.preflight_columns):
        with pytest.raises(DataError) as info:
            check(args)
        message = str(info.value)
        assert "\n" not in message
        assert "'question'" in message and path in message
        assert "columns: problem, solution, level" in message


@pytest.mark.parametrize("name, content", [("e.jsonl", ""), ("e.json", "[]"), ("e.csv", "a,b\n")])
def test_empty_file_is_a_data_error(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError) as info:
        data.load_datasets(make_args(dataset_name=str(path)))
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_zero_row_parquet_is_a_data_error(tmp_path):
    path = tmp_path / "e.parquet"
    pq.write_table(pa.table({"problem": pa.array([], pa.string())}), path)
    with pytest.raises(DataError, match="e.parquet"):
        data.load_datasets(make_args(dataset_name=str(path)))


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        data.load_datasets(make_args(dataset_name=str(tmp_path / "nope.jsonl")))


# ---------------------------------------------------------------------------------------------
# mixtures
# ---------------------------------------------------------------------------------------------


def mixture_args(tmp_path, seed=0, test_split_size=None, num_rows=100):
    path = write_rows(tmp_path / "extra.jsonl")
    raw = {
        "datasets": [
            {"id": "builtin:arithmetic", "weight": 0.5},
            {"path": str(path), "columns": ["problem", "solution"]},
        ],
        "seed": seed,
        "test_split_size": test_split_size,
    }
    return make_args(dataset_mixture=data.parse_mixture(raw), dataset_num_rows=num_rows)


def test_mixture_weights_and_determinism(tmp_path):
    train = data.load_datasets(mixture_args(tmp_path))["train"]
    assert len(train) == 50 + 10
    assert set(train.column_names) == {"prompt", "solution"}
    assert train.to_dict() == data.load_datasets(mixture_args(tmp_path))["train"].to_dict()
    other = data.load_datasets(mixture_args(tmp_path, seed=1))["train"]
    assert other["solution"] != train["solution"]


def test_mixture_weight_keeps_at_least_one_row():
    ds = datasets.Dataset.from_dict({"x": list(range(10))})
    assert len(data.subsample(ds, 0.01, seed=0)) == 1
    assert len(data.subsample(ds, 0.26, seed=0)) == 3
    assert data.subsample(ds, 0.5, seed=4)["x"] == data.subsample(ds, 0.5, seed=4)["x"]


def test_mixture_test_split(tmp_path):
    whole = data.load_datasets(mixture_args(tmp_path))["train"]
    dd = data.load_datasets(mixture_args(tmp_path, test_split_size=0.2))
    assert (len(dd["train"]), len(dd["test"])) == (48, 12)
    parts = list(dd["train"]["solution"]) + list(dd["test"]["solution"])
    assert sorted(parts) == sorted(whole["solution"])


def test_mixture_test_split_too_small():
    raw = {"datasets": [{"id": "builtin:arithmetic"}], "test_split_size": 0.5}
    args = make_args(dataset_mixture=data.parse_mixture(raw), dataset_num_rows=1)
    with pytest.raises(DataError, match="test_split_size: 0.5 of 1 rows"):
        data.load_datasets(args)


def test_mixture_column_mismatch_and_missing_selected_column(tmp_path):
    path = str(write_rows(tmp_path / "extra.jsonl"))
    raw = {"datasets": [{"id": "builtin:arithmetic"}, {"path": path}]}
    with pytest.raises(DataError, match=r"datasets\[1\].*same 'columns'"):
        data.load_datasets(make_args(dataset_mixture=data.parse_mixture(raw)))
    raw["datasets"][1]["columns"] = ["question", "solution"]
    args = make_args(dataset_mixture=data.parse_mixture(raw))
    for check in (data.load_datasets, data.preflight_columns):
        with pytest.raises(DataError) as info:
            check(args)
        assert str(info.value) == (
            f"dataset_mixture.datasets[1]: column 'question' not in {path} "
            "(columns: problem, solution, level); set 'columns' or the prompt column"
        )


def test_parse_mixture_defaults():
    assert data.parse_mixture(None) is None
    mixture = data.parse_mixture({"datasets": [{"id": "org/ds"}, {"path": "x.csv"}]})
    assert mixture == DatasetMixture(
        datasets=(
            MixtureEntry(id="org/ds", path=None, config=None, split="train", weight=1.0),
            MixtureEntry(id=None, path="x.csv"),
        ),
        seed=0,
        test_split_size=None,
    )


BAD_MIXTURES = [
    ([1, 2], "dataset_mixture"),
    ({"datasets": [{"id": "a/b"}], "sed": 1}, "dataset_mixture.sed"),
    ({"datasets": []}, "dataset_mixture.datasets"),
    ({"datasets": {"id": "a/b"}}, "dataset_mixture.datasets"),
    ({}, "dataset_mixture.datasets"),
    ({"datasets": ["a/b"]}, "dataset_mixture.datasets[0]"),
    ({"datasets": [{"id": "a/b", "path": "x.jsonl"}]}, "dataset_mixture.datasets[0]"),
    ({"datasets": [{"config": "c"}]}, "dataset_mixture.datasets[0]"),
    ({"datasets": [{"id": "a/b", "wieght": 1}]}, "dataset_mixture.datasets[0].wieght"),
    ({"datasets": [{"id": "a/b", "weight": 0}]}, "dataset_mixture.datasets[0].weight"),
    ({"datasets": [{"id": "a/b"}, {"id": "c/d", "weight": 1.5}]}, "datasets[1].weight"),
    ({"datasets": [{"id": "a/b", "weight": "half"}]}, "dataset_mixture.datasets[0].weight"),
    ({"datasets": [{"id": "a/b", "weight": True}]}, "dataset_mixture.datasets[0].weight"),
    ({"datasets": [{"id": 3}]}, "dataset_mixture.datasets[0].id"),
    ({"datasets": [{"id": "builtin:algebra"}]}, "dataset_mixture.datasets[0].id"),
    ({"datasets": [{"path": "x.jsonl", "split": "test"}]}, "dataset_mixture.datasets[0].split"),
    ({"datasets": [{"id": "a/b", "columns": "problem"}]}, "dataset_mixture.datasets[0].columns"),
    ({"datasets": [{"id": "a/b", "columns": ["a", "a"]}]}, "dataset_mixture.datasets[0].columns"),
    ({"datasets": [{"id": "a/b", "config": ""}]}, "dataset_mixture.datasets[0].config"),
    ({"datasets": [{"id": "a/b"}], "seed": 1.5}, "dataset_mixture.seed"),
    ({"datasets": [{"id": "a/b"}], "test_split_size": 1}, "dataset_mixture.test_split_size"),
    ({"datasets": [{"id": "a/b"}], "test_split_size": -0.1}, "dataset_mixture.test_split_size"),
]


@pytest.mark.parametrize("raw, key", BAD_MIXTURES)
def test_parse_mixture_errors(raw, key):
    with pytest.raises(DataError) as info:
        data.parse_mixture(raw, source="recipes/x.yaml")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("recipes/x.yaml: ")
    assert key in message and "(got " in message and "; " in message


# ---------------------------------------------------------------------------------------------
# source selection, hub path, preflight
# ---------------------------------------------------------------------------------------------


def test_exactly_one_source_and_builtin_splits():
    with pytest.raises(DataError, match="neither is set"):
        data.load_datasets(make_args())
    mixture = data.parse_mixture({"datasets": [{"id": "builtin:mixed"}]})
    with pytest.raises(DataError, match="both are set"):
        data.load_datasets(make_args(dataset_name="builtin:mixed", dataset_mixture=mixture))
    with pytest.raises(DataError, match="parse_mixture"):
        data.load_datasets(make_args(dataset_mixture={"datasets": []}))
    with pytest.raises(DataError, match="only has a 'train' split"):
        data.load_datasets(make_args(dataset_name="builtin:mixed", dataset_test_split="test"))


def fake_hub(calls):
    """A stand-in for datasets.load_dataset that records hub calls and loads local files."""
    real = datasets.load_dataset

    def load_dataset(path, name=None, **kwargs):
        if path in ("json", "parquet", "csv"):
            return real(path, name, **kwargs)
        calls.append((path, name, kwargs))
        return datasets.Dataset.from_dict({"problem": ["p1", "p2"], "solution": [1, 2]})

    return load_dataset


def test_hub_path_calls_load_dataset(monkeypatch):
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", fake_hub(calls))
    args = make_args(dataset_name="org/math", dataset_config="main", dataset_test_split="test")
    dd = data.load_datasets(args)
    assert calls == [
        ("org/math", "main", {"split": "train"}),
        ("org/math", "main", {"split": "test"}),
    ]
    assert dd["test"][1]["solution"] == "2"

    calls.clear()
    raw = {"datasets": [{"id": "org/other", "config": "c", "split": "validation", "weight": 0.5}]}
    dd = data.load_datasets(make_args(dataset_mixture=data.parse_mixture(raw)))
    assert calls == [("org/other", "c", {"split": "validation"})]
    assert len(dd["train"]) == 1


def test_preflight_checks_local_and_builtin_but_never_the_hub(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", fake_hub(calls))
    path = str(write_rows(tmp_path / "rows.parquet"))
    raw = {"datasets": [{"id": "org/ds"}, {"id": "builtin:arithmetic"}, {"path": path}]}
    data.preflight_columns(make_args(dataset_mixture=data.parse_mixture(raw)))
    data.preflight_columns(make_args(dataset_name="org/ds", dataset_prompt_column="nope"))
    assert calls == []
    with pytest.raises(DataError, match="builtin:arithmetic.*columns: problem, solution"):
        data.preflight_columns(
            make_args(dataset_name="builtin:arithmetic", dataset_answer_column="answer")
        )


# prompt_template (data/prompt_template.py): plain-text prompts around each row's prompt.


def test_prompt_template_renders_each_prompt_as_plain_text(tmp_path):
    path = tmp_path / "rows.jsonl"
    write_rows(path)
    args = make_args(
        dataset_name=str(path), system_prompt="Be brief.", prompt_template="{system}\nQ: {prompt}"
    )
    train = data.load_datasets(args)["train"]
    assert train.features["prompt"] == datasets.Value("string")  # TRL: not conversational
    assert train[0]["prompt"] == "Be brief.\nQ: What is 0 + 1?"
    assert train[0]["solution"] == "1"


def test_named_prompt_templates_are_upstreams():
    r1 = data.to_conversation(
        datasets.Dataset.from_list(ROWS[:1]), "problem", "solution", None, prompt_template="r1"
    )[0]["prompt"]
    assert r1.startswith("A conversation between User and Assistant.")
    assert r1.endswith("User: What is 0 + 1?\nAssistant: <think>")
    qwen = data.to_conversation(
        datasets.Dataset.from_list(ROWS[:1]), "problem", None, None, prompt_template="qwen_math"
    )[0]["prompt"]
    assert "\\boxed{}" in qwen and "<|im_start|>user\nWhat is 0 + 1?<|im_end|>" in qwen
    assert set(data.NAMED_TEMPLATES) == {"r1", "qwen_math", "no"}


@pytest.mark.parametrize(
    ("template", "system", "says"),
    [
        ("Q: {question}", None, "unknown placeholder {question}"),
        ("no placeholder here", None, "has no {prompt} placeholder"),
        ("r1", "Be brief.", "has no {system} placeholder, so system_prompt would be dropped"),
        ("{system} {prompt}", None, "system_prompt is not set"),
        ("{prompt} \\boxed{", None, "is not a valid template"),
    ],
)
def test_a_prompt_template_without_its_placeholders_is_one_line(template, system, says):
    with pytest.raises(DataError) as err:
        data.check_prompt_template(make_args(prompt_template=template, system_prompt=system))
    assert says in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("prompt_template: ")


def test_a_template_needs_text_prompts_not_message_lists():
    rows = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(DataError, match="row 0 of the dataset has prompt"):
        data.to_conversation(rows, "prompt", None, None, prompt_template="{prompt}")


def test_check_reports_a_bad_prompt_template_with_the_other_problems(tmp_path):
    from maxent_grpo.errors import ConfigProblems
    from maxent_grpo.preflight import check_recipe
    from maxent_grpo.recipe import build_recipe, read_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "model_name_or_path: ./no-such-model\ndataset_name: builtin:arithmetic\n"
        "use_cpu: true\nbf16: false\nnum_generations: 4\nper_device_train_batch_size: 4\n"
        f"output_dir: {tmp_path / 'out'}\nprompt_template: 'Q: {{question}}'\n"
    )
    with pytest.raises(ConfigProblems) as err:
        check_recipe(build_recipe(read_recipe(["--config", str(recipe)]), 1))
    problems = "\n".join(err.value.problems)
    assert "prompt_template: unknown placeholder {question}" in problems
    assert "model_name_or_path: './no-such-model'" in problems
