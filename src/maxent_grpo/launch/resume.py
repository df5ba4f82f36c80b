"""A later start of a run: the settings it started with, and what this start may change.

A run's first start records its recipe, method, recipe overrides and effective values
(rundir/settings.py). A later start of the same output_dir lays the recorded overrides under
its own (`with_recorded`), so `bash training.sh` after `bash training.sh -- --max_steps 200`
resumes towards step 200. A key that changes training and differs from the recorded value
(a new override, an edited recipe file, another method) stops the start with one line naming
each key and both values, unless the start accepts the change (`--accept-changes`). Under a
Slurm requeue the same command runs again: nothing differs. Pure: the launcher reads and
writes the files (launch/attempt.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from maxent_grpo.errors import UserError
from maxent_grpo.launch.launcher import RunRequest
from maxent_grpo.recipe import RecipeKeys
from maxent_grpo.recipe.script_keys import DEFAULT_REWARD_FUNCS
from maxent_grpo.rundir.settings import RunSettings, as_json_values

ACCEPT_FLAG = "--accept-changes"

# Keys that say where a run is logged, saved, watched or served, not what it learns.
_NOT_TRAINING = {
    "output_dir",
    "run_name",
    "report_to",
    "project",
    "hang_timeout",
    "max_requeues",
    "resume_from_checkpoint",
    "push_to_hub",
    "disable_tqdm",
    "num_completions_to_print",
    "skip_memory_metrics",
    "local_rank",
    "do_eval",
    "do_predict",
    "vllm_tensor_parallel_size",
    "vllm_gpu_memory_utilization",
    "vllm_group_port",
}
_NOT_TRAINING_PREFIXES = (
    "logging_",
    "log_",
    "save_",
    "hub_",
    "wandb_",
    "trackio_",
    "eval_",
    "benchmark",
    "vllm_server_",
)


def changes_training(key: str) -> bool:
    return key not in _NOT_TRAINING and not key.startswith(_NOT_TRAINING_PREFIXES)


def with_recorded(request: RunRequest, recorded: RunSettings | None) -> RunRequest:
    """The request with the recorded overrides under its own (its own win where both set)."""
    if recorded is None or not recorded.overrides:
        return request
    overrides = (*recorded.overrides, *request.overrides)
    return dataclasses.replace(request, overrides=overrides)


def settings_of(keys: RecipeKeys, request: RunRequest) -> RunSettings:
    """What to record: the overrides the request ran with (recorded ones included)."""
    return RunSettings(keys.path, keys.method, tuple(request.overrides), dict(keys.values))


def changed_keys(recorded: RunSettings, keys: RecipeKeys) -> list[tuple[str, Any, Any]]:
    """(key, recorded value, this start's value) for each training key that differs."""
    now, before = _as_trained(as_json_values(keys.values)), _as_trained(recorded.values)
    changed = [("method", recorded.method, keys.method)] if recorded.method != keys.method else []
    for key in sorted(now):
        if key in before and changes_training(key):
            if before[key] != now[key]:
                changed.append((key, before[key], now[key]))
    return changed


def _as_trained(values: dict[str, Any]) -> dict[str, Any]:
    """An unset reward_funcs without an environment trains with the default list; runs recorded
    while that default was written into the value hold the list, and resume unchanged."""
    if values.get("reward_funcs") is None and not values.get("environment"):
        return {**values, "reward_funcs": list(DEFAULT_REWARD_FUNCS)}
    return values


def refuse_changes(output_dir: Path, changed: list[tuple[str, Any, Any]]) -> UserError:
    """One line: each changed key with both values, and the flag that accepts them."""
    listed = "; ".join(f"{key} {old!r} -> {new!r}" for key, old, new in changed)
    return UserError(
        f"{output_dir} was started with other settings ({listed}); rerun without the change "
        f"to resume as started, or add {ACCEPT_FLAG} to train on with the new values"
    )


def check_max_steps(output_dir: Path, max_steps: int, checkpoint_step: int | None) -> None:
    """A max_steps below the resume point would end the run at once, marked complete."""
    if checkpoint_step is not None and 0 < max_steps < checkpoint_step:
        raise UserError(
            f"{output_dir} resumes from step {checkpoint_step}, past max_steps {max_steps}; "
            f"give -- --max_steps {checkpoint_step} or more, or use another --run-name"
        )
