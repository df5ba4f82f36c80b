"""Tests for maxent_grpo.rewards: an edge-case table per built-in plus registry tests."""

from __future__ import annotations

import inspect
import math
import pickle

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
    "ascii_fraction",
    "binary_code",
    "boxed_accuracy_math",
    "boxed_missing_penalty",
    "code",
    "code_format",
    "cosine",
    "digit_fraction",
    "format",
    "gsm8k_answer",
    "keyword_match",
    "length",
    "python_unit_tests",
    "reasoning_steps",
    "repetition_penalty",
    "soft_overlong_punishment",
    "tag_count",
]
# Rewards that run the completion's program: tested in test_code_rewards.py.
EXECUTING = {"binary_code", "code", "python_unit_tests"}
TEXT_BUILTINS = [name for name in BUILTINS if name not in EXECUTING]
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
    ("gsm8k_answer", {}, ["48 + 24 = 72\n#### 72"], {"solution": ["72"]}, [1.0]),
    (
        "gsm8k_answer",
        {},
        ["#### 1,200", "#### 72.0", "72"],
        {"solution": ["1200", "72", "72"]},
        [1.0, 0.0, 0.0],
    ),
    ("gsm8k_answer", {}, ["#### 5 then #### 7"], {"solution": ["7"]}, [1.0]),
    ("gsm8k_answer", {}, ["#### 7"], {"solution": [None]}, [None]),
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
    # ---- reasoning_steps (open-r1's markers, min(1, count / 3)) -------------------------
    ("reasoning_steps", {}, ["Step 1: add. Step 2: carry. Step 3: done."], {}, [1.0]),
    ("reasoning_steps", {}, [conv("First, add.\nFinally, done.")], {}, [2 / 3]),
    ("reasoning_steps", {}, ["Plan:\n- a\n- b\n* c\n- d"], {}, [1.0]),
    # No re.MULTILINE in open-r1: "N." counts only at the very start of the completion.
    ("reasoning_steps", {}, ["1. a\n2. b\n3. c"], {}, [1 / 3]),
    ("reasoning_steps", {}, ["42"], {}, [0.0]),
    ("reasoning_steps", {}, [""], {}, [0.0]),
    # ---- cosine (exact values at t = 0 and t = 1; the curve is tested below) -------------
    ("cosine", {"cosine_max_len": 1}, ["<answer>4</answer>"], {"solution": ["4"]}, [0.5]),
    ("cosine", {"cosine_max_len": 1}, ["<answer>5</answer>"], {"solution": ["4"]}, [-0.5]),
    ("cosine", {"cosine_max_len": 1}, [""], {"solution": ["4"]}, [0.0]),
    ("cosine", {}, ["<answer>4</answer>"], {"solution": ["no idea"]}, [None]),
    (
        "cosine",
        {"cosine_max_len": 1, "cosine_min_value_correct": 0.25, "cosine_max_value_wrong": -2},
        ["\\boxed{4}", conv("\\boxed{5}")],
        {"solution": ["4", "4"]},
        [0.25, -2.0],
    ),
    # ---- boxed_accuracy_math ------------------------------------------------------------
    ("boxed_accuracy_math", {}, ["so $\\boxed{0.5}$"], {"solution": ["\\frac{1}{2}"]}, [1.0]),
    ("boxed_accuracy_math", {}, ["\\boxed{\\frac{1}{2}}"], {"solution": ["0.5"]}, [1.0]),
    ("boxed_accuracy_math", {}, [conv("\\fbox{7}")], {"solution": ["7"]}, [1.0]),
    ("boxed_accuracy_math", {}, ["\\boxed{1} no, \\boxed{2}"], {"solution": ["2"]}, [1.0]),
    ("boxed_accuracy_math", {}, ["\\boxed{1} no, \\boxed{2}"], {"solution": ["1"]}, [0.0]),
    ("boxed_accuracy_math", {}, ["\\boxed{(1, 2)}"], {"solution": ["(1,2)"]}, [1.0]),
    # Only a closed \boxed{} counts: no <answer> block, no anchored prose.
    ("boxed_accuracy_math", {}, ["<answer>7</answer>"], {"solution": ["7"]}, [0.0]),
    ("boxed_accuracy_math", {}, ["The final answer is $7$."], {"solution": ["7"]}, [0.0]),
    ("boxed_accuracy_math", {}, ["\\boxed{7"], {"solution": ["7"]}, [0.0]),
    ("boxed_accuracy_math", {}, ["\\boxed{7}"], {"solution": ["no idea"]}, [None]),
    # ---- boxed_missing_penalty ----------------------------------------------------------
    ("boxed_missing_penalty", {}, ["so $\\boxed{7}$"], {}, [0.0]),
    ("boxed_missing_penalty", {}, [conv("\\boxed{\\frac{1}{2}}")], {}, [0.0]),
    ("boxed_missing_penalty", {}, ["the answer is 7"], {}, [-1.0]),
    ("boxed_missing_penalty", {}, ["\\boxed{7"], {}, [-1.0]),
    ("boxed_missing_penalty", {}, [""], {}, [-1.0]),
    # GSM8K: the reference's number is after "####"; so is a completion's, without <answer>.
    ("accuracy", {}, ["so 12 * 6 = 72\n#### 72"], {"solution": ["12*6=72 apples\n#### 72"]}, [1.0]),
    (
        "accuracy",
        {},
        ["<answer>1250</answer>"],
        {"solution": ["5 * 250 = 1250\n#### 1,250"]},
        [1.0],
    ),
    (
        "accuracy",
        {},
        ["<answer>1250</answer>"],
        {"solution": ["1250 - 2 = 1248\n#### 1248"]},
        [0.0],
    ),
    ("accuracy", {}, ["#### 5"], {"solution": ["2 + 3 = 5\n#### 5"]}, [1.0]),
    # ---- keyword_match ------------------------------------------------------------------
    ("keyword_match", {}, ["It is paris."], {"solution": ["Paris"]}, [1.0]),
    ("keyword_match", {}, ["Parisian food"], {"solution": ["Paris"]}, [0.0]),
    ("keyword_match", {}, ["a green apple"], {"solution": ["red, green apple"]}, [0.5]),
    ("keyword_match", {}, ["apple green"], {"solution": ["green apple"]}, [0.0]),
    ("keyword_match", {}, [conv("Red! and GREEN")], {"solution": [["red", "green"]]}, [1.0]),
    ("keyword_match", {}, ["anything"], {"solution": [" , "]}, [None]),
    # ---- digit_fraction -----------------------------------------------------------------
    ("digit_fraction", {}, ["12 + 34"], {}, [0.8]),
    ("digit_fraction", {}, [conv("123")], {}, [1.0]),
    ("digit_fraction", {}, ["none"], {}, [0.0]),
    ("digit_fraction", {}, ["  \n "], {}, [0.0]),
    ("digit_fraction", {}, [""], {}, [0.0]),
    # ---- ascii_fraction -----------------------------------------------------------------
    ("ascii_fraction", {}, ["x = 2 ü"], {}, [0.75]),
    ("ascii_fraction", {}, [conv("42")], {}, [1.0]),
    ("ascii_fraction", {}, ["\ufffd\ufffd"], {}, [0.0]),
    ("ascii_fraction", {}, ["  \n "], {}, [0.0]),
    ("ascii_fraction", {}, [""], {}, [0.0]),
    ("ascii_fraction", {}, ["~!\x7f"], {}, [2 / 3]),
    # ---- code_format --------------------------------------------------------------------
    ("code_format", {}, ["```python\nprint(1)\n```"], {}, [1.0]),
    ("code_format", {}, [conv("Here:\n```python\ndef f():\n    return 1\n```\nDone.")], {}, [1.0]),
    ("code_format", {}, ["```python\nprint(\n```"], {}, [0.0]),
    ("code_format", {}, ["```python\nprint(1)\n```\n```python\nprint(\n```"], {}, [0.0]),
    ("code_format", {}, ["```py\nprint(1)\n```"], {}, [0.0]),
    ("code_format", {}, ["print(1)"], {}, [0.0]),
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
    assert {case[0] for case in CASES} == set(TEXT_BUILTINS)


@pytest.mark.parametrize("length", [18, 100, 250, 500, 999, 1000, 1500])
def test_cosine_follows_the_half_cosine_between_its_bounds(length):
    (cosine,) = get_reward_funcs(["cosine"], cosine_min_value_wrong=-1.0)
    text = "<answer>4</answer>".ljust(length)  # 18 characters, then spaces
    right, wrong = cosine([text, text], solution=["4", "5"])
    c = (1 + math.cos(math.pi * min(length, 1000) / 1000)) / 2  # 1 when short, 0 at 1000
    assert right == pytest.approx(0.5 + (1.0 - 0.5) * c)
    assert wrong == pytest.approx(-0.5 + (-1.0 + 0.5) * c)
    assert 0.5 <= right <= 1.0 and -1.0 <= wrong <= -0.5


def test_cosine_lengths_past_max_len_score_as_max_len():
    (cosine,) = get_reward_funcs(["cosine"], cosine_max_len=20)
    long = "<answer>4</answer>" + " " * 100
    assert cosine([long, long[:20]], solution=["4", "4"]) == [0.5, 0.5]


# ---- registry ------------------------------------------------------------------------------


def test_list_reward_names_sorted():
    assert list_reward_names() == sorted(BUILTINS)


def test_reward_settings_defaults():
    assert REWARD_SETTINGS == {
        "overlong_max_length": 1024,
        "overlong_buffer": 256,
        "repetition_n_grams": 3,
        "repetition_max_penalty": -1.0,
        # open-r1's defaults
        "cosine_min_value_wrong": 0.0,
        "cosine_max_value_wrong": -0.5,
        "cosine_min_value_correct": 0.5,
        "cosine_max_value_correct": 1.0,
        "cosine_max_len": 1000,
        "code_provider": "local",
        "code_language": "python",
        "parallel_code_exec_per_proc": 2,
        "code_timeout_seconds": 5.0,
        "code_memory_mb": 1024,
        "code_sandbox": "bwrap",
        "reward_server_timeout_seconds": 30.0,
        "reward_server_retries": 2,
        "reward_server_token_env": None,
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


@pytest.mark.parametrize("name", TEXT_BUILTINS)
def test_builtins_pickle(name):
    # TRL's async GRPO worker pickles reward functions into a spawned process.
    (func,) = get_reward_funcs([name], overlong_max_length=20, overlong_buffer=10)
    clone = pickle.loads(pickle.dumps(func))
    assert clone.__name__ == name
    assert clone(["<answer>4</answer>"], solution=["4"]) == func(
        ["<answer>4</answer>"], solution=["4"]
    )


@pytest.mark.parametrize("name", TEXT_BUILTINS)
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


@pytest.mark.parametrize(
    "name", ["accuracy", "answer_match", "length", "cosine", "boxed_accuracy_math", "keyword_match"]
)
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
        ({"cosine_max_len": 0}, "cosine_max_len"),
        ({"cosine_min_value_wrong": "low"}, "cosine_min_value_wrong must be a finite number"),
        ({"code_provider": "docker"}, "code_provider must be one of local, e2b, morph"),
        ({"code_language": "cpp"}, "code_language must be one of python"),
        ({"code_timeout_seconds": 0}, "code_timeout_seconds must be > 0"),
        ({"parallel_code_exec_per_proc": 0}, "parallel_code_exec_per_proc"),
        ({"code_memory_mb": 8}, "code_memory_mb must be an integer >= 64"),
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


def test_math_rewards_print_no_timeout_warning():
    """math-verify warns once per process that its timeout is off; ours is the reward guard's,
    so every trainer and eval process would print a line the user cannot act on."""
    import subprocess
    import sys

    script = (
        "import logging; logging.basicConfig()\n"
        "from maxent_grpo.rewards.builtin import accuracy\n"
        "print(accuracy([[{'content': '<answer>\\\\frac{1}{2}</answer>'}]], solution=['$0.5$']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[1.0]"
    assert "Timeout is disabled" not in done.stderr
