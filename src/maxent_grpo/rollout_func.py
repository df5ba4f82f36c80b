"""The recipe's own rollout function (`rollout_func: module:function`): found by name, checked.

TRL 1.16's GRPOTrainer calls it instead of its own generation, as `function(prompts, trainer)`:
`prompts` are this process's prompts (each repeated num_generations times in a row, one row
per completion, as the data loader gives them), and it returns a dict with `prompt_ids`,
`completion_ids` and `logprobs` (one list per row; logprobs may be None), optionally `env_mask`
(1: a policy token, 0: a token the function inserted, out of the loss) and other fields, which
reach the reward functions. docs/rollouts.md says which recipes it works with; the trainer side
and an example (a two-turn self-check) are train/rollout_func.py. A leaf, standard library only:
the recipe's check and the trainer share this.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from maxent_grpo.errors import ConfigError

KEY = "rollout_func"
SIGNATURE = "function(prompts, trainer) -> dict"


def find_rollout_func(name: str) -> Callable:
    """The function `name` ('module:function') names; a ConfigError (one line) when it does not
    import, is not callable or cannot be called as function(prompts, trainer)."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise ConfigError(
            f"{KEY}: {name!r} is not module:function; name an importable {SIGNATURE}, "
            "e.g. maxent_grpo.train.rollout_func:self_check"
        )
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
        raise ConfigError(
            f"{KEY}: cannot import {name!r} ({reason}); fix the module path (on PYTHONPATH) "
            "or the function name"
        ) from None
    if not callable(function):
        raise ConfigError(f"{KEY}: {name!r} is not callable; name a {SIGNATURE}")
    try:
        signature = inspect.signature(function)
        signature.bind(["prompt"], object())
    except TypeError:
        takes = signature.replace(return_annotation=inspect.Signature.empty)
        raise ConfigError(
            f"{KEY}: {name!r} takes {takes}, but TRL calls it as "
            f"{SIGNATURE}; give it those two positional parameters"
        ) from None
    except ValueError:  # no signature to read (a builtin): TRL's call decides
        pass
    return function
