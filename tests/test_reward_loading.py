"""Custom rewards named as module:function, and the built-ins off the main thread."""

from __future__ import annotations

import threading

import pytest

from maxent_grpo.rewards import RewardError, get_reward_funcs

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
