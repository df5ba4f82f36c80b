"""Reward names: the built-in registry, its settings, and ``module:function`` custom rewards."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from maxent_grpo.rewards import code, remote, sandbox
from maxent_grpo.rewards.common import RewardError, RewardFunc
from maxent_grpo.rewards.sandbox import Limits

# --------------------------------------------------------------------------------------
# Settings of the parametrised built-ins: name -> (default, check). A check takes the
# setting's name and raw value (YAML or CLI: numbers may arrive as strings) and returns
# the value to use, or raises RewardError.
# --------------------------------------------------------------------------------------


def _int_at_least(minimum: int) -> Callable[[str, Any], int]:
    def check(key: str, value: Any) -> int:
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise RewardError(f"setting {key} must be an integer >= {minimum}, got {value!r}")
        return value

    return check


def _number(key: str, value: Any) -> float:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value.strip())
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RewardError(f"setting {key} must be a finite number, got {value!r}")
    return float(value)


def _penalty(key: str, value: Any) -> float:
    value = _number(key, value)
    if value > 0:
        raise RewardError(f"setting {key} must be <= 0, got {value!r}")
    return value


def _positive(key: str, value: Any) -> float:
    value = _number(key, value)
    if value <= 0:
        raise RewardError(f"setting {key} must be > 0, got {value!r}")
    return value


def _variable_name(key: str, value: Any) -> str | None:
    if value is None or (isinstance(value, str) and re.fullmatch(r"[A-Za-z_]\w*", value)):
        return value
    raise RewardError(f"setting {key} must name an environment variable, got {value!r}")


def _one_of(*choices: str) -> Callable[[str, Any], str]:
    def check(key: str, value: Any) -> str:
        if value not in choices:
            raise RewardError(f"setting {key} must be one of {', '.join(choices)}, got {value!r}")
        return value

    return check


_SETTINGS: dict[str, tuple[Any, Callable[[str, Any], Any]]] = {
    "overlong_max_length": (1024, _int_at_least(1)),
    "overlong_buffer": (256, _int_at_least(1)),
    "repetition_n_grams": (3, _int_at_least(1)),
    "repetition_max_penalty": (-1.0, _penalty),
    # open-r1's cosine keys and defaults
    "cosine_min_value_wrong": (0.0, _number),
    "cosine_max_value_wrong": (-0.5, _number),
    "cosine_min_value_correct": (0.5, _number),
    "cosine_max_value_correct": (1.0, _number),
    "cosine_max_len": (1000, _int_at_least(1)),
    # code rewards: open-r1's keys, plus the local sandbox's limits
    "code_provider": ("local", _one_of("local", *code.REMOTE_PROVIDERS)),
    "code_language": ("python", _one_of("python")),
    "parallel_code_exec_per_proc": (2, _int_at_least(1)),
    "code_timeout_seconds": (5.0, _positive),
    "code_memory_mb": (1024, _int_at_least(64)),
    "code_sandbox": ("bwrap", _one_of(*sandbox.ISOLATIONS)),
    # reward servers (remote.py)
    "reward_server_timeout_seconds": (30.0, _positive),
    "reward_server_retries": (2, _int_at_least(0)),
    "reward_server_token_env": (None, _variable_name),
}

#: Settings understood by the parametrised built-in rewards, with their defaults.
REWARD_SETTINGS: dict[str, Any] = {name: default for name, (default, _) in _SETTINGS.items()}


def _resolve_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(settings) - set(_SETTINGS))
    if unknown:
        raise RewardError(
            f"unknown reward setting(s) {', '.join(unknown)}; "
            f"valid settings: {', '.join(sorted(_SETTINGS))}"
        )
    merged = {**REWARD_SETTINGS, **settings}
    return {name: check(name, merged[name]) for name, (_, check) in _SETTINGS.items()}


def _sandbox(settings: Mapping[str, Any]) -> tuple[Limits, int]:
    """Limits and parallel runs of the rewards that execute code; remote providers refused."""
    code.refuse_provider(settings["code_provider"])
    limits = Limits(
        wall_seconds=settings["code_timeout_seconds"],
        memory_mb=settings["code_memory_mb"],
        isolation=settings["code_sandbox"],
    )
    sandbox.require(limits.isolation)  # one line naming what is missing, or the weak mode's log
    return limits, settings["parallel_code_exec_per_proc"]


# Registry: name -> builder taking the resolved settings.
_REGISTRY: dict[str, Callable[[Mapping[str, Any]], RewardFunc]] = {
    "accuracy": lambda s: _builtin().accuracy,
    "answer_match": lambda s: _builtin().answer_match,
    "gsm8k_answer": lambda s: _builtin().gsm8k_answer,
    "format": lambda s: _builtin().format,
    "tag_count": lambda s: _builtin().tag_count,
    "length": lambda s: _builtin().length,
    "soft_overlong_punishment": lambda s: _builtin().SoftOverlongPunishment(
        s["overlong_max_length"], s["overlong_buffer"]
    ),
    "repetition_penalty": lambda s: _builtin().RepetitionPenalty(
        s["repetition_n_grams"], s["repetition_max_penalty"]
    ),
    "reasoning_steps": lambda s: _builtin().reasoning_steps,
    "cosine": lambda s: _builtin().CosineScaled(
        s["cosine_min_value_wrong"],
        s["cosine_max_value_wrong"],
        s["cosine_min_value_correct"],
        s["cosine_max_value_correct"],
        s["cosine_max_len"],
    ),
    "boxed_accuracy_math": lambda s: _builtin().boxed_accuracy_math,
    "boxed_missing_penalty": lambda s: _builtin().boxed_missing_penalty,
    "digit_fraction": lambda s: _builtin().digit_fraction,
    "ascii_fraction": lambda s: _builtin().ascii_fraction,
    "keyword_match": lambda s: _builtin().keyword_match,
    "code": lambda s: code.CodeTests(False, *_sandbox(s)),
    "binary_code": lambda s: code.CodeTests(True, *_sandbox(s)),
    "python_unit_tests": lambda s: code.UnitTests(*_sandbox(s)),
    "code_format": lambda s: code.code_format,
}


# --------------------------------------------------------------------------------------
# Custom rewards: "module:function"
# --------------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise ModuleNotFoundError(f"No such file '{path}'")
    name = path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import '{path}'")
    module = importlib.util.module_from_spec(spec)
    registered = sys.modules.setdefault(name, module) is module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if registered:
            del sys.modules[name]
        raise
    return module


def _import_module(module_name: str) -> ModuleType:
    if module_name.endswith(".py") or os.sep in module_name:
        return _import_file(Path(module_name))
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Entry-point scripts do not put the working directory on sys.path; let
        # "my_rewards:fn" find ./my_rewards.py all the same.
        cwd = os.getcwd()
        top = module_name.split(".")[0]
        on_path = {os.path.abspath(p or os.curdir) for p in sys.path}
        if exc.name != top or cwd in on_path:
            raise
        sys.path.insert(0, cwd)
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as retry_exc:
            if retry_exc.name == top:
                raise exc from None
            raise
        finally:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)


def load_callable(spec: str, what: str = "reward") -> Any:
    """The callable a `module:function` spec names (what: reward or tool, for the message)."""
    module_name, _, attr = spec.rpartition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not module_name or not attr:
        raise RewardError(f"invalid {what} spec {spec!r}: expected 'module:function'")
    try:
        module = _import_module(module_name)
    except Exception as exc:  # any import-time failure is reported
        raise RewardError(f"cannot load {what} {spec!r}: {_one_line(exc)}") from exc
    obj: Any = module
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise RewardError(f"cannot load {what} {spec!r}: {_one_line(exc)}") from exc
    if not callable(obj):
        raise RewardError(
            f"cannot load {what} {spec!r}: TypeError: {attr!r} in module {module_name!r} "
            f"is not callable (got {type(obj).__name__})"
        )
    return obj


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


def _builtin() -> ModuleType:
    """The text rewards, imported on first use: they import math-verify and sympy (about
    0.5 s), which the launcher's check of the reward names does not need."""
    from maxent_grpo.rewards import builtin  # deferred: math-verify and sympy

    return builtin


def list_reward_names() -> list[str]:
    """Names of the built-in rewards, sorted."""
    return sorted(_REGISTRY)


def get_reward_funcs(names: Sequence[str], **settings: Any) -> list[RewardFunc | str]:
    """Resolve reward names into TRL reward callables, in the given order.

    Each name is either a built-in (see :func:`list_reward_names`) or a
    ``module:function`` spec: the module is imported (a module on ``sys.path``, in
    the working directory, or a ``path/to/file.py``) and the attribute returned
    as is. ``http(s)://...`` is a reward server (remote.RemoteReward) and
    ``model:<hub id or path>`` a reward model, returned as the name TRL loads (or, when
    the launcher serves it, REWARD_MODEL_VARIABLE set: a RemoteReward to its server).
    ``settings`` override ``REWARD_SETTINGS`` for the parametrised built-ins
    (``soft_overlong_punishment``, ``repetition_penalty``) and the reward servers.

    Raises:
        maxent_grpo.rewards.common.RewardError: an unknown name, a spec that cannot be
            loaded, or an unknown or invalid setting. The message is a single line.
    """
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise RewardError(f"reward names must be a list of strings, got {names!r}")
    resolved = _resolve_settings(settings)
    funcs: list[RewardFunc | str] = []
    for raw in names:
        if not isinstance(raw, str):
            raise RewardError(f"reward names must be strings, got {raw!r}")
        name = raw.strip()
        if remote.is_server(name):
            timeout = resolved["reward_server_timeout_seconds"]
            headers = remote.server_headers(resolved["reward_server_token_env"])
            retries = resolved["reward_server_retries"]
            funcs.append(remote.RemoteReward(name, timeout, retries, headers=headers))
        elif name.startswith(remote.MODEL_PREFIX) and os.environ.get(remote.REWARD_MODEL_VARIABLE):
            # reward_model_gpus: the launcher serves the model; score through its server.
            url = os.environ[remote.REWARD_MODEL_VARIABLE]
            timeout = resolved["reward_server_timeout_seconds"]
            retries = resolved["reward_server_retries"]
            funcs.append(remote.served_reward_model(name, url, timeout, retries))
        elif name.startswith(remote.MODEL_PREFIX):
            funcs.append(remote.reward_model_name(name))  # a name TRL loads; not a callable
        elif name in _REGISTRY:
            funcs.append(_REGISTRY[name](resolved))
        elif name in code.JUDGED_REWARDS:
            code.refuse_judged(name)
        elif ":" in name:
            funcs.append(load_callable(name))
        else:
            raise RewardError(
                f"unknown reward {raw!r}; valid names: {', '.join(list_reward_names())} "
                "(or 'module:function' for a custom reward, http(s)://... for a reward server, "
                "model:<hub id or path> for a reward model)"
            )
    return funcs
