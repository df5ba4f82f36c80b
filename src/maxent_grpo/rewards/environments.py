"""An environment from a recipe: `environment: mypkg.envs:Calculator` -> TRL `environment_factory`.

TRL's GRPOTrainer makes one instance of the class per rollout (pooled, reused across batches),
calls its `reset(**row)` before generation (a string it returns is appended to the last user
message), offers its public methods as tools in TRL's tool-calling loop (their results are
masked out of the loss like any tool's), and, when the class defines `get_reward()`, scores
each finished rollout with it as one more reward (weight 1, named after the class).

What is ours: the check before any GPU time (a class, a `reset`, every public method typed
and documented as TRL's tool schema needs; one line naming the problem, without making an
instance), and the recipe's tool limits (tool_timeout_seconds, tool_output_max_chars) on its
methods, as on the recipe's `tools`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from maxent_grpo.recipe.script_keys import DEFAULT_REWARD_FUNCS
from maxent_grpo.rewards.common import RewardError
from maxent_grpo.rewards.guard import call_with_timeout
from maxent_grpo.rewards.registry import load_callable
from maxent_grpo.rewards.tools import check_schema, truncated

# Methods TRL does not offer the model as tools.
_NOT_TOOLS = ("reset", "get_reward")


def tool_methods(cls: type) -> dict[str, Callable]:
    """The methods TRL offers as tools: public functions of the class, except the two above
    (TRL lists them on the class, as here)."""
    return {
        name: fn
        for name, fn in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in _NOT_TOOLS and not name.startswith("_")
    }


def _limited_method(method: Callable, timeout: float, max_chars: int) -> Callable:
    @functools.wraps(method)
    def limited(self, **kwargs: Any) -> str:
        return truncated(str(call_with_timeout(method, timeout, self, **kwargs)), max_chars)

    return limited


def get_environment(spec: str | None, settings: dict[str, Any]) -> type | None:
    """The recipe's environment class, checked, its tool methods under the recipe's limits
    (a subclass of the same name: TRL names the environment's reward after the class).
    `settings`: tool_timeout_seconds and tool_output_max_chars."""
    if not spec:
        return None
    spec = str(spec).strip()
    cls = load_callable(spec, "environment")
    if not inspect.isclass(cls):
        raise RewardError(
            f"environment {spec!r}: a {type(cls).__name__}, not a class; name a class with a "
            "reset method and tool methods (docs/tools.md)"
        )
    if not callable(getattr(cls, "reset", None)):
        raise RewardError(
            f"environment {spec!r}: no reset method; TRL calls reset(**row) before each "
            "rollout (return None, or a string appended to the prompt)"
        )
    methods = tool_methods(cls)
    if not methods:
        raise RewardError(
            f"environment {spec!r}: no public method to offer as a tool; define at least one "
            "(type hints and a docstring with Args:)"
        )
    for name, method in methods.items():
        check_schema(f"{spec}.{name}", method)  # its `self` is skipped, as TRL does
    limits = settings["tool_timeout_seconds"], settings["tool_output_max_chars"]
    wrapped = {
        name: _limited_method(method, *limits)
        for name, method in methods.items()
        if not inspect.iscoroutinefunction(method)  # TRL awaits those on its own loop
    }
    return type(cls.__name__, (cls,), {**wrapped, "__module__": cls.__module__})


def scores_its_rollouts(environment: type | None) -> bool:
    """Whether the environment has get_reward, which TRL adds as a reward of weight 1."""
    return environment is not None and callable(getattr(environment, "get_reward", None))


def reward_names(names: list[str] | None, environment: type | None) -> list[str]:
    """The recipe's reward_funcs; unset: none when the environment scores rollouts itself
    (scores_its_rollouts), else DEFAULT_REWARD_FUNCS."""
    if names is not None:
        return list(names)
    if scores_its_rollouts(environment):
        return []
    return list(DEFAULT_REWARD_FUNCS)


def reward_note(names: list[str], environment: type | None) -> str | None:
    """What scores the rollouts, for `check`, when the environment's get_reward does (TRL adds
    it after reward_funcs, weight 1); None otherwise. names: reward_names' answer."""
    if not scores_its_rollouts(environment):
        return None
    name = environment.__name__
    own = f"{name}.get_reward (the environment's, weight 1, logged as rewards/{name}/mean)"
    if not names:
        return f"reward: {own} alone; reward_funcs is unset or empty"
    return f"rewards: {', '.join(names)} (reward_funcs) and {own}"
