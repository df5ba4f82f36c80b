"""Tests for maxent_grpo.rewards: an edge-case table per built-in plus registry tests."""

from __future__ import annotations

import inspect
import pickle
import threading

import pytest

from maxent_grpo.rewards import (
    REWARD_SETTINGS,
    RewardError,
    get_reward_funcs,
    list_reward_names,
)

BUILTINS = [
    "accuracy",
    "answer_match",
    "format",
    "length",
    "repetition_penalty",
    "soft_overlong_punishment",
    "tag_count",
]
GOOD_FORMAT = "<think>\n2+2\n</think>\n<answer>\n4\n</answer>"


def conv(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


# (reward name, settings, completions, keyword arguments, expected rewards)
CASES = [
    # ---- accuracy -----------------------------------------------------------------------
    ("accuracy", {}, ["<answer>42</answer>"], {"solution": ["42"]}, [1.0]),
    ("accuracy", {}, ["<answer>41</answer>"], {"solution": ["42"]}, [0.0]),
    ("accuracy", {}, [conv("<answer>42</answer>")], {"solution": ["42"]}, [1.0]),
    ("accuracy", {}, ["<answer>\n   42  \n</answer>"], {"solution": [" 42\n"]}, [1.0]),
    ("accuracy", {}, ["<answer>0.5</answer>"], {"solution": ["\\frac{1}{2}"]}, [1.0]),
    ("accuracy", {}, ["<answer>$\\frac{1}{2}$</answer>"], {"solution": ["0.5"]}, [1.0]),
    ("accuracy", {}, ["<answer>\\frac{1}{2}</answer>"], {"solution": ["$0.5$"]}, [1.0]),
    ("accuracy", {}, ["<answer>1/3</answer>"], {"solution": ["\\frac{1}{2}"]}, [0.0]),
    ("accuracy", {}, ["The answer is $\\frac{1}{2}$."], {"solution": ["0.5"]}, [1.0]),
    ("accuracy", {}, ["So we get \\boxed{7}."], {"solution": ["7"]}, [1.0]),
    ("accuracy", {}, ["So we get \\boxed{8}."], {"solution": ["7"]}, [0.0]),
    ("accuracy", {}, ["Try 3, then $\\boxed{\\frac{1}{2}}$"], {"solution": ["1/2"]}, [1.0]),
    # Without an <answer> block or an anchor, a bare number is not an answer (as open-r1).
    ("accuracy", {}, ["42"], {"solution": ["42"]}, [0.0]),
    ("accuracy", {}, [""], {"solution": ["42"]}, [0.0]),
    ("accuracy", {}, [conv("")], {"solution": ["42"]}, [0.0]),
    # Unparsable reference -> None (skipped), whatever the completion.
    ("accuracy", {}, ["<answer>42</answer>"], {"solution": ["no idea"]}, [None]),
    ("accuracy", {}, ["<answer>no idea</answer>"], {"solution": ["no idea"]}, [None]),
    ("accuracy", {}, ["<answer>42</answer>"], {"solution": [""]}, [None]),
    ("accuracy", {}, ["<answer>42</answer>"], {"solution": [None]}, [None]),
    ("accuracy", {}, ["<answer>42</answer>"], {"solution": [42]}, [1.0]),
    # Only the last <answer> block counts.
    ("accuracy", {}, ["<answer>3</answer> wait <answer>42</answer>"], {"solution": ["42"]}, [1.0]),
    ("accuracy", {}, ["<answer>42</answer> wait <answer>3</answer>"], {"solution": ["42"]}, [0.0]),
    # Bare LaTeX references and answers are parsed whole, not as their last number.
    ("accuracy", {}, ["<answer>\\sqrt{8}</answer>"], {"solution": ["2\\sqrt{2}"]}, [1.0]),
    ("accuracy", {}, ["<answer>2</answer>"], {"solution": ["2\\sqrt{2}"]}, [0.0]),
    ("accuracy", {}, ["<answer>(1, 2)</answer>"], {"solution": ["(1,2)"]}, [1.0]),
    ("accuracy", {}, ["<answer>2</answer>"], {"solution": ["(1, 2)"]}, [0.0]),
    (
        "accuracy",
        {},
        ["<think>\nx = 3\n</think>\n<answer>\n3\n</answer>"],
        {"solution": ["We find $x = 3$, so the answer is $\\boxed{3}$."]},
        [1.0],
    ),
    (
        "accuracy",
        {},
        ["<answer>5</answer>", "<answer>4</answer>", "nothing"],
        {"solution": ["5", "5", "5"]},
        [1.0, 0.0, 0.0],
    ),
    # ---- answer_match -------------------------------------------------------------------
    ("answer_match", {}, ["<answer>42</answer>"], {"solution": ["42"]}, [1.0]),
    ("answer_match", {}, ["<answer>\n 42 \n</answer>"], {"solution": ["42  "]}, [1.0]),
    ("answer_match", {}, [conv("<answer>42</answer>")], {"solution": ["42"]}, [1.0]),
    ("answer_match", {}, ["<answer>42</answer>"], {"solution": [42]}, [1.0]),
    ("answer_match", {}, ["<answer>42.0</answer>"], {"solution": ["42"]}, [0.0]),
    ("answer_match", {}, ["The answer is 42"], {"solution": ["42"]}, [0.0]),
    ("answer_match", {}, [""], {"solution": ["42"]}, [0.0]),
    ("answer_match", {}, ["<answer>1</answer><answer>42</answer>"], {"solution": ["42"]}, [1.0]),
    ("answer_match", {}, ["<answer>42</answer><answer>1</answer>"], {"solution": ["42"]}, [0.0]),
    ("answer_match", {}, ["<answer>1<answer>42</answer>"], {"solution": ["42"]}, [1.0]),
    ("answer_match", {}, ["<answer>42"], {"solution": ["42"]}, [0.0]),
    ("answer_match", {}, ["<answer></answer>"], {"solution": [""]}, [1.0]),
    ("answer_match", {}, ["<answer>42</answer>"], {"solution": [None]}, [None]),
    # ---- format -------------------------------------------------------------------------
    ("format", {}, [GOOD_FORMAT], {}, [1.0]),
    ("format", {}, [conv(GOOD_FORMAT)], {}, [1.0]),
    ("format", {}, ["<think>\na\nb\n</think>\n<answer>\nc\nd\n</answer>"], {}, [1.0]),
    ("format", {}, ["<answer>\n4\n</answer>"], {}, [0.0]),
    ("format", {}, ["<think>\n2+2\n</think>\n4"], {}, [0.0]),
    ("format", {}, ["<think>2+2</think><answer>4</answer>"], {}, [0.0]),
    ("format", {}, ["<think>\n2+2\n</think>\n<answer>\n4\n"], {}, [0.0]),
    ("format", {}, ["Sure! " + GOOD_FORMAT], {}, [0.0]),
    # re.MULTILINE: "$" also matches at a line end, so trailing lines pass (as open-r1).
    ("format", {}, [GOOD_FORMAT + "\ntrailing"], {}, [1.0]),
    ("format", {}, [GOOD_FORMAT + " trailing"], {}, [0.0]),
    ("format", {}, [""], {}, [0.0]),
    # ---- tag_count ----------------------------------------------------------------------
    ("tag_count", {}, [GOOD_FORMAT], {}, [1.0]),
    ("tag_count", {}, [conv(GOOD_FORMAT)], {}, [1.0]),
    ("tag_count", {}, ["<think>\nhmm\n</think>\n4"], {}, [0.5]),
    ("tag_count", {}, ["\n<answer>\n4\n</answer>"], {}, [0.5]),
    ("tag_count", {}, ["<think>\n<think>\nhmm\n</think>\n<answer>\n4\n</answer>"], {}, [0.75]),
    ("tag_count", {}, ["<think>\nhmm\n</think>\n<answer>4</answer>"], {}, [0.5]),
    ("tag_count", {}, [""], {}, [0.0]),
    # ---- length (one call = one group) --------------------------------------------------
    (
        "length",
        {},
        ["<answer>4</answer>", "<answer>5</answer>"],
        {"solution": ["4", "4"]},
        [0.0, 0.0],
    ),
    (
        "length",
        {},
        ["<answer>4</answer>", "<answer>5</answer>", "I think... <answer>4</answer>"],
        {"solution": ["4", "4", "4"]},
        [0.5, 0.0, -0.5],
    ),
    (
        "length",
        {},
        ["<answer>5</answer>", "I think... <answer>5</answer>", "I think... <answer>4</answer>"],
        {"solution": ["4", "4", "4"]},
        [0.0, -0.5, -0.5],
    ),
    (
        # The sample with an unparsable reference is skipped and does not set max_len.
        "length",
        {},
        ["<answer>4</answer>", "I think... <answer>4</answer>", "x" * 100],
        {"solution": ["4", "4", "no idea"]},
        [0.5, -0.5, None],
    ),
    ("length", {}, ["<answer>4</answer>"], {"solution": ["no idea"]}, [None]),
    (
        "length",
        {},
        [conv("<answer>4</answer>"), conv("I think... <answer>4</answer>")],
        {"solution": ["4", "4"]},
        [0.5, -0.5],
    ),
    # ---- soft_overlong_punishment -------------------------------------------------------
    ("soft_overlong_punishment", {}, ["x" * 768], {}, [0.0]),
    ("soft_overlong_punishment", {}, ["x" * 896], {}, [-0.5]),
    ("soft_overlong_punishment", {}, ["x" * 1024], {}, [-1.0]),
    ("soft_overlong_punishment", {}, ["x" * 1025], {}, [-1.0]),
    ("soft_overlong_punishment", {}, [""], {}, [0.0]),
    ("soft_overlong_punishment", {}, [conv("x" * 832)], {}, [-0.25]),
    # completion_ids (tokens) take precedence over the text length.
    ("soft_overlong_punishment", {}, ["short"], {"completion_ids": [[7] * 896]}, [-0.5]),
    ("soft_overlong_punishment", {}, ["x" * 5000], {"completion_ids": [[7] * 100]}, [0.0]),
    ("soft_overlong_punishment", {}, ["x"], {"completion_ids": [[7] * 2000]}, [-1.0]),
    (
        "soft_overlong_punishment",
        {"overlong_max_length": 20, "overlong_buffer": 10},
        ["x" * 10, "x" * 15, "x" * 20, "x" * 21],
        {},
        [0.0, -0.5, -1.0, -1.0],
    ),
    (
        "soft_overlong_punishment",
        {"overlong_max_length": 20, "overlong_buffer": 4},
        ["a", "b"],
        {"completion_ids": [[1] * 16, [1] * 19]},
        [0.0, -0.75],
    ),
    # ---- repetition_penalty -------------------------------------------------------------
    ("repetition_penalty", {}, ["a b c a b c"], {}, [-0.25]),
    ("repetition_penalty", {}, ["A b C a B c"], {}, [-0.25]),
    ("repetition_penalty", {}, [conv("a b c a b c")], {}, [-0.25]),
    ("repetition_penalty", {}, ["the cat sat on the mat"], {}, [0.0]),
    ("repetition_penalty", {}, ["hello world"], {}, [0.0]),
    ("repetition_penalty", {}, [""], {}, [0.0]),
    ("repetition_penalty", {}, ["   \n  "], {}, [0.0]),
    ("repetition_penalty", {}, ["a  b\tc\na b c"], {}, [-0.25]),
    ("repetition_penalty", {"repetition_max_penalty": -0.5}, ["a b c a b c"], {}, [-0.125]),
    ("repetition_penalty", {"repetition_n_grams": 2}, ["a a a a a"], {}, [-0.75]),
    ("repetition_penalty", {"repetition_n_grams": 1}, ["x x x x"], {}, [-0.75]),
    ("repetition_penalty", {"repetition_max_penalty": 0.0}, ["a b c a b c"], {}, [0.0]),
]


def _case_id(case: tuple) -> str:
    name, settings, completions, _, _ = case
    first = completions[0]
    text = first[-1]["content"] if isinstance(first, list) else first
    suffix = f"-{settings}" if settings else ""
    return f"{name}{suffix}-{text[:40]!r}"


@pytest.mark.parametrize(
    ("name", "settings", "completions", "kwargs", "expected"),
    CASES,
    ids=[_case_id(case) for case in CASES],
)
def test_reward_table(name, settings, completions, kwargs, expected):
    (func,) = get_reward_funcs([name], **settings)
    result = func(completions, **kwargs)
    assert result == expected
    assert [type(r) for r in result] == [type(e) for e in expected]


def test_table_covers_every_builtin():
    assert len(CASES) >= 40
    assert {case[0] for case in CASES} == set(BUILTINS)


# ---- registry ------------------------------------------------------------------------------


def test_list_reward_names_sorted():
    assert list_reward_names() == sorted(BUILTINS)


def test_reward_settings_defaults():
    assert REWARD_SETTINGS == {
        "overlong_max_length": 1024,
        "overlong_buffer": 256,
        "repetition_n_grams": 3,
        "repetition_max_penalty": -1.0,
    }


def test_unknown_name_lists_valid_names():
    with pytest.raises(RewardError) as err:
        get_reward_funcs(["accuracy", "acuracy"])
    message = str(err.value)
    assert isinstance(err.value, ValueError)
    assert "\n" not in message
    assert "'acuracy'" in message
    assert ", ".join(sorted(BUILTINS)) in message
    assert "module:function" in message


def test_names_order_kept_and_empty_list():
    funcs = get_reward_funcs(["tag_count", "accuracy", "tag_count"])
    assert [f.__name__ for f in funcs] == ["tag_count", "accuracy", "tag_count"]
    assert get_reward_funcs([]) == []


def test_names_must_be_a_list():
    with pytest.raises(RewardError, match="list of strings"):
        get_reward_funcs("accuracy")


@pytest.mark.parametrize("name", BUILTINS)
def test_dunder_name_is_registry_name(name):
    (func,) = get_reward_funcs([name])
    assert func.__name__ == name
    assert inspect.getdoc(func) and "Example" in inspect.getdoc(func)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtins_pickle(name):
    # TRL's async GRPO worker pickles reward functions into a spawned process.
    (func,) = get_reward_funcs([name], overlong_max_length=20, overlong_buffer=10)
    clone = pickle.loads(pickle.dumps(func))
    assert clone.__name__ == name
    assert clone(["<answer>4</answer>"], solution=["4"]) == func(
        ["<answer>4</answer>"], solution=["4"]
    )


@pytest.mark.parametrize("name", BUILTINS)
def test_extra_kwargs_accepted(name):
    (func,) = get_reward_funcs([name])
    completions = [conv("<think>\nok\n</think>\n<answer>\n4\n</answer>")] * 2
    result = func(
        completions=completions,
        prompts=[[{"role": "user", "content": "2+2?"}]] * 2,
        completion_ids=[[1, 2, 3], [4, 5]],
        trainer_state=object(),
        log_extra=lambda *a, **k: None,
        log_metric=lambda *a, **k: None,
        solution=["4", "4"],
        problem=["2+2?", "2+2?"],
        some_column=[1, 2],
    )
    assert len(result) == 2
    assert all(r is None or isinstance(r, float) for r in result)


@pytest.mark.parametrize("name", ["accuracy", "answer_match", "length"])
def test_missing_or_misaligned_solution(name):
    (func,) = get_reward_funcs([name])
    with pytest.raises(RewardError, match="solution"):
        func(["<answer>4</answer>"])
    with pytest.raises(RewardError, match="2 completions but 1 solutions"):
        func(["<answer>4</answer>"] * 2, solution=["4"])


# ---- settings ------------------------------------------------------------------------------


def test_unknown_setting_is_named():
    with pytest.raises(RewardError) as err:
        get_reward_funcs(["accuracy"], overlong_max_len=10)
    assert "overlong_max_len" in str(err.value)
    assert "overlong_max_length" in str(err.value)  # lists the valid ones


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"repetition_max_penalty": 0.5}, "repetition_max_penalty must be <= 0"),
        ({"repetition_max_penalty": "x"}, "repetition_max_penalty"),
        ({"repetition_n_grams": 0}, "repetition_n_grams"),
        ({"repetition_n_grams": True}, "repetition_n_grams"),
        ({"overlong_buffer": 0}, "overlong_buffer"),
        ({"overlong_max_length": 2.5}, "overlong_max_length"),
    ],
)
def test_invalid_settings(settings, match):
    with pytest.raises(RewardError, match=match):
        get_reward_funcs(["repetition_penalty", "soft_overlong_punishment"], **settings)


def test_overlong_buffer_larger_than_max_length():
    with pytest.raises(RewardError, match="must not exceed"):
        get_reward_funcs(["soft_overlong_punishment"], overlong_max_length=100)
    # Only checked when the reward is requested.
    assert get_reward_funcs(["accuracy"], overlong_max_length=100)[0].__name__ == "accuracy"


def test_numeric_string_settings_are_coerced():
    (func,) = get_reward_funcs(
        ["soft_overlong_punishment"], overlong_max_length="20", overlong_buffer="10"
    )
    assert func(["x" * 15]) == [-0.5]


# ---- module:function -----------------------------------------------------------------------

CUSTOM_MODULE = """
def my_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]

NOT_CALLABLE = 3
"""


def test_module_function_loading(tmp_path, monkeypatch):
    (tmp_path / "mx_custom_rewards.py").write_text(CUSTOM_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "mx_custom_rewards", raising=False)
    funcs = get_reward_funcs(["accuracy", "mx_custom_rewards:my_reward"])
    assert funcs[1].__name__ == "my_reward"
    assert funcs[1](["ab", "abc"]) == [2.0, 3.0]


def test_module_function_from_working_directory(tmp_path, monkeypatch):
    import sys

    (tmp_path / "mx_cwd_rewards.py").write_text(CUSTOM_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "mx_cwd_rewards", raising=False)
    (func,) = get_reward_funcs(["mx_cwd_rewards:my_reward"])
    assert func(["abcd"]) == [4.0]
    assert str(tmp_path) not in sys.path  # the working directory is not left on sys.path


def test_module_function_from_file_path(tmp_path, monkeypatch):
    import sys

    path = tmp_path / "mx_file_rewards.py"
    path.write_text(CUSTOM_MODULE)
    monkeypatch.delitem(sys.modules, "mx_file_rewards", raising=False)
    (func,) = get_reward_funcs([f"{path}:my_reward"])
    assert func(["a"]) == [1.0]


def test_failed_import_is_one_line():
    with pytest.raises(RewardError) as err:
        get_reward_funcs(["mx_no_such_module_xyz:fn"])
    message = str(err.value)
    assert "\n" not in message
    assert "mx_no_such_module_xyz:fn" in message
    assert "ModuleNotFoundError: No module named 'mx_no_such_module_xyz'" in message


def test_import_time_error_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "mx_broken_rewards.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RewardError) as err:
        get_reward_funcs(["mx_broken_rewards:fn"])
    assert "\n" not in str(err.value)
    assert "RuntimeError: boom second line" in str(err.value)


def test_missing_attribute_and_not_callable(tmp_path, monkeypatch):
    (tmp_path / "mx_attr_rewards.py").write_text(CUSTOM_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RewardError) as err:
        get_reward_funcs(["mx_attr_rewards:nope"])
    assert "mx_attr_rewards:nope" in str(err.value)
    assert "AttributeError" in str(err.value) and "nope" in str(err.value)
    with pytest.raises(RewardError, match="not callable"):
        get_reward_funcs(["mx_attr_rewards:NOT_CALLABLE"])


@pytest.mark.parametrize("spec", [":fn", "module:", ":"])
def test_malformed_spec(spec):
    with pytest.raises(RewardError, match="module:function"):
        get_reward_funcs([spec])


# ---- threads -------------------------------------------------------------------------------


def test_accuracy_off_the_main_thread():
    (accuracy,) = get_reward_funcs(["accuracy"])
    results: dict[str, object] = {}

    def work():
        try:
            results["value"] = accuracy(
                ["<answer>$\\frac{1}{2}$</answer>", "\\boxed{3}", "<answer>9</answer>"],
                solution=["0.5", "3", "no idea"],
            )
        except Exception as exc:  # pragma: no cover - reported below
            results["error"] = exc

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert "error" not in results, results.get("error")
    assert results["value"] == [1.0, 1.0, None]
