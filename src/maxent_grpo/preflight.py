"""The built recipe's checks that need the layers above recipe/: its rewards resolve, its data
has the columns it names, its benchmarks parse and their data is there; run together with
recipe/checks.py's rules (check_recipe), so every problem is reported in one pass.

Called by the launcher and `maxent-grpo check` before anything is queued or started, and by
each trainer before a model loads. Importing this module is cheap (the launcher does): data/
and rewards/ import datasets and sympy, so they are imported where a rule needs them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from maxent_grpo.benchmarks.checks import check_benchmarks
from maxent_grpo.data.errors import DataError
from maxent_grpo.errors import ConfigError, UserError
from maxent_grpo.methods import RL_METHODS, uses_vllm_server
from maxent_grpo.recipe import Recipe
from maxent_grpo.recipe.checks import (
    REFERENCE,
    check_launch,
    check_model_path,
    check_output_dir,
    check_reference_model,
)
from maxent_grpo.recipe.problems import collecting
from maxent_grpo.recipe.rules import check_model_rules, check_rollout_func


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A recipe's reward functions (unguarded), tools and environment class: what
    check_rewards resolved, kept on the checked recipe so the trainer uses them as they are
    (each resolved once per process: a custom reward or tool module is imported once)."""

    reward_funcs: list
    tools: list
    environment: type | None


def check_rewards(script_args, training_args) -> Resolved:
    """The reward functions, tools and environment resolve and agree (check_context measures
    the tools' and environment's schemas; the trainer takes all three)."""
    from maxent_grpo.rewards import get_reward_funcs  # imports sympy (math rewards): seconds

    if (script_args.tools or script_args.environment) and script_args.prompt_template:
        # TRL reads tool calls from chat turns: on plain text its tool loop fails mid-step.
        raise ConfigError(
            f"prompt_template: {script_args.prompt_template!r} sends plain-text prompts, but "
            "tools and environment need chat messages; remove prompt_template"
        )
    try:
        from maxent_grpo.rewards.tools import get_tools  # imports transformers: seconds

        tools = get_tools(script_args.tools, script_args.tool_settings())  # imports, checks
        from maxent_grpo.rewards.environments import (  # imports transformers
            get_environment,
            reward_names,
            scores_its_rollouts,
        )

        environment = get_environment(script_args.environment, script_args.tool_settings())
        names = reward_names(script_args.reward_funcs, environment)
        if not names and not scores_its_rollouts(environment):
            raise ConfigError(
                "reward_funcs: empty and no environment with get_reward scores the rollouts; "
                "give at least one reward function, e.g. reward_funcs: [accuracy]"
            )
        funcs = get_reward_funcs(
            names, **script_args.reward_settings(training_args.max_completion_length)
        )
    except UserError as exc:  # the registry's one line: one problem among the recipe's others
        raise ConfigError(str(exc)) from None
    weights = training_args.reward_weights
    if weights is not None and len(weights) != len(funcs):
        raise ConfigError(
            f"reward_weights: {len(weights)} weights for {len(funcs)} reward_funcs "
            f"({', '.join(names) or 'none'}); give one weight per reward function (the "
            "environment's get_reward has weight 1)"
        )
    return Resolved(funcs, tools, environment)


def check_context(script_args, training_args, model_args, tools=(), environment=None) -> list:
    """Server mode with vllm_max_model_length: the longest prompt (measured on the builtin and
    local sources, a mixture's too, with the policy's tokenizer and the schemas of `tools` and
    `environment`, as check_rewards resolved them) plus what each turn asks for fits it
    (rewards/context.py). script_args.dataset_mixture: parsed. Returns notes for `check`: the
    hub sources it could not read (no hub access before training)."""
    limit = training_args.vllm_max_model_length
    if not (uses_vllm_server(training_args) and limit):
        return []
    from maxent_grpo.rewards.context import (  # imports transformers (environments.py)
        fits_context,
        longest_prompt,
        schema_tools,
    )

    train, read, hub = _local_rows(script_args)
    rows = [] if train is None else train["prompt"]
    prompt, how = 0, "not measured: a hub dataset is read when training starts"
    notes = []
    if hub:
        notes.append(
            f"vllm_max_model_length: the prompts of {', '.join(hub)} (hub) are not measured: "
            "no hub access before training; only the rest of each request was checked"
        )
    if rows:
        from transformers import AutoTokenizer  # seconds

        tokenizer = AutoTokenizer.from_pretrained(  # as the trainers load it (train/entry.py)
            model_args.model_name_or_path,
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
        )
        if training_args.chat_template is not None:
            tokenizer.chat_template = training_args.chat_template
        prompt = longest_prompt(rows, tokenizer, schema_tools(list(tools), environment))
        how = f"measured over {len(rows)} rows of {', '.join(read)}"
        if hub:
            how += f"; {', '.join(hub)} not read"
    iterations = training_args.max_tool_calling_iterations
    multi_turn = bool(script_args.tools or script_args.environment) and iterations != 0
    try:
        fits_context(limit, training_args.max_completion_length, multi_turn, prompt, how)
    except UserError as exc:
        raise ConfigError(str(exc)) from None
    return notes


def _local_rows(script_args) -> tuple[Any, list[str], list[str]]:
    """The training rows of the recipe's builtin and local sources (None when there are none),
    loaded as training loads them (a mixture's entries selected, converted and weighted with
    its seed; its test split kept in: evaluations send those prompts too), the names read and
    the hub names left out."""
    from maxent_grpo.data import load_datasets, source_kind  # imports datasets: seconds
    from maxent_grpo.data.load import entry_name  # imports datasets: seconds

    mixture = script_args.dataset_mixture
    if mixture is None:
        name = script_args.dataset_name
        if source_kind(name) == "hub":
            return None, [], [name]
        with _no_progress_bars():
            return load_datasets(script_args)["train"], [name], []
    kinds = [source_kind(entry_name(e), e.path is not None) for e in mixture.datasets]
    local = tuple(e for e, kind in zip(mixture.datasets, kinds) if kind != "hub")
    hub = [entry_name(e) for e, kind in zip(mixture.datasets, kinds) if kind == "hub"]
    if not local:
        return None, [], hub
    part = dataclasses.replace(mixture, datasets=local, test_split_size=None)
    with _no_progress_bars():
        loaded = load_datasets(dataclasses.replace(script_args, dataset_mixture=part))
    return loaded["train"], [entry_name(e) for e in local], hub


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """A check prints its verdict only: no "Generating train split" bars around the one line."""
    import datasets  # seconds

    bars_were_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if bars_were_on:
            datasets.enable_progress_bars()


def _check_columns(script_args, mixture) -> None:
    from maxent_grpo.data import preflight_columns  # imports datasets: seconds

    with _no_progress_bars():
        preflight_columns(dataclasses.replace(script_args, dataset_mixture=mixture))


def check_recipe(recipe: Recipe) -> Recipe:
    """Validate what can be validated without a model; returns the recipe, mixture parsed,
    with notes for `check` added (what scores the rollouts, data not measured).

    The batch arithmetic is checked when the recipe is built, for its number of processes.
    Every rule runs (a rule whose section could not be built is skipped) and the problems are
    raised together (recipe/problems.py).
    """
    script, training = recipe.script, recipe.training
    with collecting(recipe.path) as problems:
        mixture, resolved, notes = _check_inputs(recipe, problems)
        notes += _check_uses(recipe, problems, mixture, resolved)
    if script is None:  # not built (its problems are collected outside): nothing to replace
        return recipe
    script = dataclasses.replace(script, dataset_mixture=mixture)
    resolved = resolved if recipe.method in RL_METHODS and training is not None else None
    notes = (*recipe.notes, *notes)
    return dataclasses.replace(recipe, script=script, notes=notes, resolved=resolved)


def _check_inputs(recipe: Recipe, problems) -> tuple[Any, Resolved, list[str]]:
    """What the recipe names resolves: its mixture, model, rewards, accelerate config, prompt
    template, reference model and data columns. Returns the parsed mixture (None when it
    failed or there is none), what check_rewards resolved and `check`'s notes."""
    from maxent_grpo.data import check_prompt_template, parse_mixture  # imports datasets

    script, training = recipe.script, recipe.training
    rl = recipe.method in RL_METHODS  # SFT has no rewards, reference, benchmarks or server
    mixture, resolved, notes = None, Resolved([], [], None), []
    if script is not None:
        with problems.check("dataset_mixture"):
            mixture = parse_mixture(script.dataset_mixture, "recipe")
    if recipe.model is not None:
        with problems.check("model_name_or_path"):
            check_model_path(recipe.model.model_name_or_path)
    if rl and script is not None and training is not None:
        with problems.check("reward_funcs", "reward_weights"):
            resolved = check_rewards(script, training)
            notes += _reward_note(script, resolved.environment)
    if recipe.launch is not None:
        with problems.check("accelerate_config"):
            check_launch(recipe.launch)
    if script is not None:
        try:
            check_prompt_template(script)
        except DataError as exc:  # data/'s one-line error, one problem among the others
            problems.add_error(exc, ["prompt_template"])
    if rl and training is not None and not problems.failed("model_name_or_path"):
        with problems.check(REFERENCE):
            check_reference_model(training, recipe.model)
    if script is not None and not problems.failed("dataset_mixture"):
        try:
            _check_columns(script, mixture)
        except DataError as exc:  # one problem: the rules below still run
            problems.add_error(exc, ["dataset_name", "dataset_prompt_column"])
    return mixture, resolved, notes


def _check_uses(recipe: Recipe, problems, mixture, resolved: Resolved) -> list[str]:
    """The rules over what _check_inputs resolved, each skipped when what it reads failed:
    the prompts fit the context, the unjudged code rows, the benchmarks, the rollout
    function, the output_dir, the rules across training and model keys. Returns notes."""
    script, training, model = recipe.script, recipe.training, recipe.model
    rl = recipe.method in RL_METHODS
    notes = []
    data_failed = problems.failed("dataset_name", "dataset_mixture")
    if rl and None not in (script, training, model):
        if not data_failed and not problems.failed("reward_funcs", "model_name_or_path"):
            with problems.check("vllm_max_model_length"):
                parsed = dataclasses.replace(script, dataset_mixture=mixture)
                tools, environment = resolved.tools, resolved.environment
                notes += check_context(parsed, training, model, tools, environment)
    if rl and script is not None and not data_failed:
        with problems.check("reward_funcs"):
            notes += _unjudged_note(dataclasses.replace(script, dataset_mixture=mixture))
    if rl and script is not None and training is not None:
        with problems.check("benchmarks"):
            check_benchmarks(script, training)
        with problems.check("rollout_func"):  # with the script's tools and environment
            check_rollout_func(training, script)
    if training is not None:
        with problems.check("output_dir"):
            check_output_dir(training.output_dir)
    if rl and training is not None and model is not None:
        # the rules across training and model keys (recipe/rules.py; the training
        # section's own ran when it was built)
        with problems.check("use_peft"):
            check_model_rules(training, model)
    return notes


def _reward_note(script_args, environment) -> list[str]:
    """`check`'s line on what scores the rollouts, when the environment's get_reward does."""
    from maxent_grpo.rewards.environments import reward_names, reward_note  # transformers

    note = reward_note(reward_names(script_args.reward_funcs, environment), environment)
    return [note] if note else []


def _unjudged_note(script_args) -> list[str]:
    """`check`'s line on the rows whose tests `python_unit_tests` cannot judge in the trainer
    (they score 0.0 whatever the program), counted on the builtin and local sources."""
    if "python_unit_tests" not in (script_args.reward_funcs or []):
        return []
    from maxent_grpo.data.load import ANSWER_COLUMN_OUT  # imports datasets
    from maxent_grpo.rewards.code import count_unjudged  # imports rewards/ (sympy): seconds

    train, read, hub = _local_rows(script_args)
    if train is None or ANSWER_COLUMN_OUT not in train.column_names:
        return []
    columns = train.column_names
    entries = train["entry_point"] if "entry_point" in columns else None
    unjudged = count_unjudged(train[ANSWER_COLUMN_OUT], entries)
    if not unjudged:
        return []
    unread = f" ({', '.join(hub)} not read: hub)" if hub else ""
    return [
        f"python_unit_tests: {unjudged} of {len(train)} rows of {', '.join(read)}{unread} have "
        "tests it cannot judge (an expected side beyond literals and built-ins): they score "
        "0.0 whatever the program (docs/code-rewards.md)"
    ]
