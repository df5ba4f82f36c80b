"""Tools from a recipe (rewards/tools.py): the sandboxed `python` tool, custom tools, their
limits, and the one-line check of `tools` that `maxent-grpo check` runs."""

from __future__ import annotations

import textwrap
import time
from types import SimpleNamespace

import pytest

from maxent_grpo.errors import ConfigError
from maxent_grpo.preflight import check_rewards
from maxent_grpo.recipe.script_keys import ScriptArguments
from maxent_grpo.rewards import RewardError, RewardTimeout
from maxent_grpo.rewards.tools import ToolError, check_schema, get_tools

SETTINGS = ScriptArguments(tool_timeout_seconds=1.0, tool_output_max_chars=50).tool_settings()

MY_TOOLS = '''
import time

def search(query: str) -> str:
    """Look a word up.

    Args:
        query: The word to look up.
    """
    return "found " + query * 100

def slow(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "awake"

def undocumented(query):
    return query
'''


def test_python_tool_runs_the_program_in_the_sandbox():
    (python,) = get_tools(["python"], SETTINGS)
    assert python.__name__ == "python" and "Args:" in python.__doc__
    check_schema("python", python)  # the schema TRL builds for the model from it
    assert python(code="print(6 * 7)") == "42\n"
    # The sandbox's isolation: no network namespace, no trainer files.
    assert python(code="import os; print(os.path.exists('/work'))") == "False\n"
    with pytest.raises(ToolError, match="ZeroDivisionError"):
        python(code="1 / 0")
    began = time.monotonic()
    with pytest.raises(ToolError, match="ran past 1s"):
        python(code="while True: pass")
    assert time.monotonic() - began < 3


def test_custom_tools_are_limited_and_checked_in_one_line(tmp_path):
    (tmp_path / "my_tools.py").write_text(textwrap.dedent(MY_TOOLS))
    path = tmp_path / "my_tools.py"
    search, slow = get_tools([f"{path}:search", f"{path}:slow"], SETTINGS)
    out = search(query="ab")
    assert out.startswith("found abab") and out.endswith("[... 156 more characters cut]")
    assert len(out.split("\n")[0]) == 50
    with pytest.raises(RewardTimeout):
        slow(seconds=10)
    with pytest.raises(RewardError, match=r"tool '.*:undocumented': .*type hints on every arg"):
        get_tools([f"{path}:undocumented"], SETTINGS)
    with pytest.raises(RewardError, match="cannot load tool 'no_such_pkg.tools:search'"):
        get_tools(["no_such_pkg.tools:search"], SETTINGS)
    with pytest.raises(RewardError, match="unknown tool 'bash'; built-in tools: python"):
        get_tools(["bash"], SETTINGS)


def test_check_passes_python_and_names_a_tool_that_cannot_be_imported():
    training = SimpleNamespace(max_completion_length=32, reward_weights=None)
    check_rewards(ScriptArguments(tools=["python"]), training)
    with pytest.raises(ConfigError) as caught:
        check_rewards(ScriptArguments(tools=["python", "mypkg.tools:search"]), training)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("cannot load tool 'mypkg.tools:search': ModuleNotFoundError")


def test_check_refuses_tools_on_plain_text_prompts():
    training = SimpleNamespace(max_completion_length=32, reward_weights=None)
    for keys in ({"tools": ["python"]}, {"environment": "helpers.tool_envs:Calculator"}):
        with pytest.raises(ConfigError, match=r"^prompt_template: 'r1' sends plain-text prompts"):
            check_rewards(ScriptArguments(prompt_template="r1", **keys), training)


def test_the_trainer_takes_the_rewards_and_tools_its_check_resolved(tiny_model, monkeypatch):
    """Issue 50: the trainer process resolved rewards, tools and environment twice, in
    check_recipe and again building the trainer; the checked recipe now carries them."""
    from helpers.paths import SMOKE
    from maxent_grpo import preflight
    from maxent_grpo.recipe import parse_recipe
    from maxent_grpo.train import entry

    flags = ["--model_name_or_path", str(tiny_model), "--tools", "python"]
    recipe = preflight.check_recipe(parse_recipe(["--config", str(SMOKE), *flags]))
    assert [tool.__name__ for tool in recipe.resolved.tools] == ["python"]
    again = []
    monkeypatch.setattr(preflight, "check_rewards", lambda *args: again.append(args))
    extra = entry._rewards_and_tools(recipe)
    assert again == [] and extra["tools"] is recipe.resolved.tools
    names = [f.__name__ for f in extra["reward_funcs"]]  # guarded: the same names
    assert names == [f.__name__ for f in recipe.resolved.reward_funcs] != [], names
