"""Checks that need no GPU and no model: run before a job is queued and again at start."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

from maxent_grpo.configs import ConfigError


def _looks_local(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", ".cache")) or os.path.exists(name)


def check_model_path(model_name_or_path: str | None) -> None:
    if not model_name_or_path:
        raise ConfigError("model_name_or_path: not set; give a local model directory or a hub id")
    if _looks_local(model_name_or_path):
        path = Path(model_name_or_path).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"model_name_or_path: {model_name_or_path!r} is not a model directory "
                "(no config.json); fix the path or use a hub id"
            )


def check_output_dir(output_dir: str | None) -> None:
    """The output directory must be writable (or creatable) before any training starts.

    Checks without creating anything: `check` and `plan` leave no empty directories behind.
    """
    if not output_dir:
        raise ConfigError("output_dir: not set; give a writable directory")
    path = Path(output_dir).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    problem = None
    if not existing.is_dir():
        problem = f"{existing} is a file"
    elif existing == path:
        try:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
                pass
        except OSError as exc:
            problem = exc.strerror
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"cannot create it in {existing}"
    if problem:
        raise ConfigError(
            f"output_dir: {output_dir!r} is not writable ({problem}); choose another directory"
        )


def check_rewards(script_args, training_args) -> None:
    from maxent_grpo.rewards import get_reward_funcs

    funcs = get_reward_funcs(
        script_args.reward_funcs,
        **script_args.reward_settings(training_args.max_completion_length),
    )
    weights = training_args.reward_weights
    if weights is not None and len(weights) != len(funcs):
        raise ConfigError(
            f"reward_weights: {len(weights)} weights for {len(funcs)} reward_funcs "
            f"({', '.join(script_args.reward_funcs)}); give one weight per reward function"
        )


def check_recipe(script_args, training_args, model_args):
    """Validate what can be validated without a model. Returns the parsed dataset mixture.

    The batch arithmetic is checked when the recipe is parsed, for the planned number of
    processes (parse_recipe's world_size).
    """
    from maxent_grpo.data import parse_mixture, preflight_columns

    mixture = parse_mixture(script_args.dataset_mixture, "recipe")
    check_model_path(model_args.model_name_or_path)
    check_rewards(script_args, training_args)
    import datasets

    # A check prints its verdict only: no "Generating train split" bars around the one line.
    bars_were_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        preflight_columns(dataclasses.replace(script_args, dataset_mixture=mixture))
    finally:
        if bars_were_on:
            datasets.enable_progress_bars()
    check_output_dir(training_args.output_dir)
    return mixture


def check_launch(launch_args) -> None:
    """Launcher keys that name files must name existing ones."""
    config = launch_args.accelerate_config
    if config and not Path(config).is_file():
        raise ConfigError(
            f"accelerate_config: {config!r} does not exist; use one of "
            "recipes/accelerate_configs/{ddp,zero2,zero3}.yaml or your own file"
        )
