"""Tools from a recipe: `tools: [python, mypkg.tools:search]` -> callables for TRL's `tools`.

TRL's GRPOTrainer runs the tool-calling loop itself (generate, parse the tool calls with the
chat template's response schema, call the tools, append their results, generate again, up to
`max_tool_calling_iterations` turns) and masks the tool results out of the loss (its
`tool_mask`). What is ours: the names, the built-in `python` tool (the program runs in the code
rewards' sandbox, sandbox.py, with the same isolation and limits), a time limit per call, the
truncation of a tool's output, and the check that every tool imports and has the typed
signature and docstring TRL turns into the schema the model sees.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from maxent_grpo.rewards import sandbox
from maxent_grpo.rewards.common import RewardError
from maxent_grpo.rewards.guard import call_with_timeout
from maxent_grpo.rewards.registry import load_callable
from maxent_grpo.rewards.sandbox import Limits

BUILTIN_TOOLS = ("python",)


class ToolError(Exception):
    """A tool call that failed; TRL hands its message to the model and counts it
    (tools/failure_frequency)."""


def truncated(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n[... {len(text) - max_chars} more characters cut]"


def make_python_tool(limits: Limits) -> Callable[[str], str]:
    """The built-in `python` tool: runs a program in a fresh sandbox, returns its stdout."""

    def python(code: str) -> str:
        """Run a Python program in a fresh sandbox and return what it printed to stdout.

        Args:
            code: The complete Python program to run; print the values you need.
        """
        result = sandbox.run_python(code, limits=limits)
        if result.status == "timeout":
            raise ToolError(f"the program ran past {limits.wall_seconds:g}s")
        if not result.ok:
            raise ToolError(f"the program failed: {result.stderr.strip()[-1000:]}")
        return result.stdout

    return python


def _limited(tool: Callable, timeout: float, max_chars: int) -> Callable:
    """A tool with the recipe's limits: a time limit per call, its output cut to max_chars."""

    @functools.wraps(tool)
    def limited(**kwargs: Any) -> str:
        return truncated(str(call_with_timeout(tool, timeout, **kwargs)), max_chars)

    return limited


def check_schema(name: str, tool: Callable) -> None:
    """The JSON schema TRL gives the model (transformers' get_json_schema): every argument
    typed and described in a Google-style docstring; else one line naming the tool."""
    from transformers.utils import get_json_schema  # deferred: transformers, seconds

    try:
        get_json_schema(tool)
    except Exception as exc:  # noqa: BLE001 - its two parsing errors and whatever else
        message = " ".join(str(exc).split())
        raise RewardError(
            f"tool {name!r}: {type(exc).__name__}: {message}; a tool needs type hints on every "
            "argument and a docstring with an Args: section describing each"
        ) from None


def get_tools(names: Sequence[str] | None, settings: dict[str, Any]) -> list[Callable]:
    """The recipe's tools, checked, with its limits. `settings`: tool_timeout_seconds,
    tool_output_max_chars, and the code sandbox's code_memory_mb and code_sandbox."""
    if not names:
        return []
    tools = []
    for raw in names:
        name = str(raw).strip()
        if name == "python":
            limits = Limits(
                wall_seconds=settings["tool_timeout_seconds"],
                memory_mb=settings["code_memory_mb"],
                isolation=settings["code_sandbox"],
            )
            sandbox.require(limits.isolation)
            tool = make_python_tool(limits)  # its schema: tests/test_tools.py
        elif ":" in name:
            tool = load_callable(name, "tool")
            check_schema(name, tool)
        else:
            raise RewardError(
                f"unknown tool {name!r}; built-in tools: {', '.join(BUILTIN_TOOLS)} "
                "(or 'module:function')"
            )
        timeout = 0 if name == "python" else settings["tool_timeout_seconds"]
        tools.append(_limited(tool, timeout, settings["tool_output_max_chars"]))
    return tools
