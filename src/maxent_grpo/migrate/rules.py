"""The rules of `migrate` that read several keys at once (upstream MaxEnt-GRPO recipes mostly).

Each rule edits the recipe's text (edits.py) and records a `Change`; what each key becomes is
the one table (this package's __init__.py).
"""

from __future__ import annotations

import re
from typing import Any

from maxent_grpo.migrate import MIGRATIONS
from maxent_grpo.migrate.edits import MARK, Change, Edits, set_value, to_yaml
from maxent_grpo.migrate.kinds import is_number
from maxent_grpo.migrate.rewards import UPSTREAM_BOXED_PENALTY, UPSTREAM_REWARDS
from maxent_grpo.migrate.upstream import ORIGIN
from maxent_grpo.recipe.schema import method_keys as keys_of
from maxent_grpo.rewards.code import JUDGED_REWARDS

_EVAL_KEYS = (
    "eval_dataset_name",
    "eval_dataset_config",
    "eval_dataset_split",
    "eval_dataset_prompt_column",
    "eval_dataset_solution_column",
    "eval_reward_funcs",
    "eval_reward_weights",
)
_PENALTIES = {"boxed_missing_penalty"}  # never a benchmark's pass/fail reward


def _reward_name(name: Any) -> Any:
    rename = UPSTREAM_REWARDS.get(name)
    return rename.builtin if rename else name


def migrate_rewards(edits: Edits, keys: dict, recipe: dict[str, Any]) -> None:
    """Upstream reward names -> built-ins (the penalty's size into its weight); judged rewards
    of open-r1 left out with their weights."""
    names = recipe.get("reward_funcs")
    penalty = recipe.get("missing_boxed_answer_penalty", UPSTREAM_BOXED_PENALTY)
    if "missing_boxed_answer_penalty" in keys:
        text = f"missing_boxed_answer_penalty: {penalty} (folded into reward_weights)"
        edits.comment_out(
            keys["missing_boxed_answer_penalty"],
            Change("missing_boxed_answer_penalty", False, text),
        )
    if not isinstance(names, list):
        return
    if not any(n in JUDGED_REWARDS or n in UPSTREAM_REWARDS for n in names):
        return
    weights = recipe.get("reward_weights")
    weighted = isinstance(weights, list) and len(weights) == len(names)
    old_weights = list(weights) if weighted else [1.0] * len(names)
    kept, new_weights = [], []
    for name, weight in zip(names, old_weights, strict=True):
        if name in JUDGED_REWARDS:
            edits.changes.append(
                Change("reward_funcs", True, f"reward {name}: it {JUDGED_REWARDS[name]}")
            )
            continue
        rename = UPSTREAM_REWARDS.get(name)
        if rename is not None:
            if rename.builtin == "boxed_missing_penalty" and is_number(penalty):
                weight = round(weight * abs(penalty), 12)
            text = f"reward {name} -> {rename.builtin} ({ORIGIN}: {rename.why})"
            edits.changes.append(Change("reward_funcs", False, text, rename.changes))
            name = rename.builtin
        kept.append(name)
        new_weights.append(weight)
    judged = [n for n in names if n in JUDGED_REWARDS]
    text = "reward_funcs: upstream's reward names -> the built-ins that score the same way"
    if judged:
        text = f"reward_funcs without {', '.join(judged)} (they need open-r1's judges)"
        if len(judged) == 1:
            text = f"reward_funcs without {judged[0]} (it {JUDGED_REWARDS[judged[0]]})"
    set_value(edits, keys["reward_funcs"], kept, Change("reward_funcs", False, text))
    if new_weights == old_weights[: len(new_weights)] and len(kept) == len(names):
        return
    change = Change("reward_weights", False, "reward_weights of the rewards kept")
    if "reward_weights" in keys:
        set_value(edits, keys["reward_weights"], new_weights, change)
    else:
        added = edits.after.setdefault(keys["reward_funcs"].last, [])
        added += [f"{MARK} {change.text}", f"reward_weights: {to_yaml(new_weights)}"]
        edits.changes.append(change)


def _benchmark_name(dataset: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", dataset.rstrip("/").rsplit("/", 1)[-1])
    return name.lstrip("_.-") or "eval"


def _eval_reward(recipe: dict[str, Any]) -> str:
    """The benchmark's reward: the first eval reward of positive weight that is not a penalty
    (upstream: eval_reward_funcs, else reward_funcs), as a built-in name."""
    names = recipe.get("eval_reward_funcs") or recipe.get("reward_funcs") or []
    weights = recipe.get("eval_reward_weights") if recipe.get("eval_reward_funcs") else None
    if not isinstance(weights, list) or len(weights) != len(names):
        weights = [1.0] * len(names)
    for name, weight in zip(names, weights, strict=True):
        built_in = _reward_name(name)
        if isinstance(built_in, str) and is_number(weight) and weight > 0:
            if built_in not in _PENALTIES and name not in JUDGED_REWARDS:
                return built_in
    return "accuracy"


def _benchmarks(recipe: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Upstream's evaluation dataset(s) as benchmark mappings; the names left out."""
    datasets = [d.strip() for d in str(recipe["eval_dataset_name"]).split(",") if d.strip()]
    entries, left_out = [], []
    for dataset in datasets:
        if "/" not in dataset:
            left_out.append(dataset)  # one of upstream's named evaluation suites
            continue
        entry = {"name": _benchmark_name(dataset), "dataset": dataset}
        entry["split"] = recipe.get("eval_dataset_split") or "validation"
        if recipe.get("eval_dataset_config"):
            entry["dataset_config"] = recipe["eval_dataset_config"]
        entry["prompt_column"] = (
            recipe.get("eval_dataset_prompt_column")
            or recipe.get("dataset_prompt_column")
            or "problem"
        )
        entry["answer_column"] = (
            recipe.get("eval_dataset_solution_column")
            or recipe.get("dataset_solution_column")
            or recipe.get("dataset_answer_column")
            or "answer"
        )
        entry["reward"] = _eval_reward(recipe)
        entries.append(entry)
    return entries, left_out


def _evaluating(recipe: dict[str, Any]) -> bool:
    strategy = recipe.get("eval_strategy", recipe.get("evaluation_strategy", "no"))
    return strategy not in (None, "no")


def fold_evaluation(edits: Edits, keys: dict, recipe: dict[str, Any]) -> set[str]:
    """``eval_dataset_*`` and ``eval_reward_*`` -> a ``benchmarks`` entry; TRL's evaluation goes off
    (upstream evaluated only that set). The keys handled here, for migrate to skip."""
    present = [k for k in _EVAL_KEYS if k in keys]
    if not present:
        return set()
    handled = set(present)
    if not recipe.get("eval_dataset_name"):
        for key in present:
            text = f"{key} (upstream: only with eval_dataset_name, which is not set)"
            edits.comment_out(keys[key], Change(key, True, text))
        return handled
    entries, suites = _benchmarks(recipe)
    cadence = "upstream evaluated every eval_steps; here each benchmark scores saved checkpoints "
    cadence += "(benchmark_every, benchmark_at_end)"
    for key in present:
        why = cadence if key == "eval_dataset_name" else MIGRATIONS[key].why
        text = (
            f"{key} -> benchmarks ({ORIGIN}: {why})"
            if entries
            else (
                f"{key} ({ORIGIN}: {', '.join(suites)}: upstream's named evaluation suites; name a "
                "dataset in benchmarks instead)"
            )
        )
        differs = key == "eval_dataset_name" and _evaluating(recipe)
        edits.comment_out(keys[key], Change(key, not entries, text, differs))
    if suites and entries:
        text = f"eval_dataset_name {', '.join(suites)}: upstream's named evaluation suites"
        edits.changes.append(Change("eval_dataset_name", True, text, True))
    if entries:
        existing = recipe.get("benchmarks") if "benchmarks" in keys else None
        benchmarks = [*(existing if isinstance(existing, list) else []), *entries]
        change = Change("benchmarks", False, "benchmarks: upstream's evaluation set")
        if "benchmarks" in keys:
            set_value(edits, keys["benchmarks"], benchmarks, change)
        else:
            where = keys[present[-1]].last
            edits.after.setdefault(where, []).extend(
                [f"{MARK} {change.text}", f"benchmarks: {to_yaml(benchmarks)}"]
            )
            edits.changes.append(change)
        recipe["benchmarks"] = benchmarks
    for key in ("eval_strategy", "evaluation_strategy"):
        if key in keys and recipe.get(key) not in (None, "no"):
            why = "the evaluation set is a benchmark now, and TRL's evaluation needs a test split"
            text = f"{key}: {recipe[key]} -> eval_strategy: no ({why})"
            set_value(edits, keys[key], "no", Change(key, False, text), "eval_strategy")
            recipe[key] = "no"
            handled.add(key)
    return handled


def _positive(value: Any) -> bool:
    return is_number(value) and value > 0


def fixed_kl(edits: Edits, keys: dict, recipe: dict[str, Any], processes: int) -> None:
    """Upstream's controller is off when kl_target or kl_horizon is 0 (a fixed beta): here a
    fixed beta is no kl_target. Its kl_horizon counted optimizer steps; here completions."""
    if "kl_target" not in keys and "kl_horizon" not in keys:
        return
    target, horizon = recipe.get("kl_target"), recipe.get("kl_horizon")
    if not (_positive(target) and _positive(horizon)):
        for key in ("kl_target", "kl_horizon"):
            if key in keys:
                why = "a controller with kl_target or kl_horizon 0 is off: beta stays fixed; "
                why += "here a fixed beta is no kl_target and no kl_horizon"
                text = f"{key}: {to_yaml(recipe[key])} ({ORIGIN}: {why})"
                edits.comment_out(keys[key], Change(key, False, text))
        return
    if "kl_ctl_step_size" not in keys:
        return  # kl_horizon written for this toolkit already (completions)
    per_process = recipe.get("per_device_train_batch_size", 8)
    steps = recipe.get("gradient_accumulation_steps", 1)
    if not (_positive(per_process) and _positive(steps)):
        return
    per_step = int(per_process * steps * processes)
    new = int(horizon * per_step)
    why = (
        f"upstream counted optimizer steps, here completions: {horizon} steps x {per_step} "
        f"completions per step ({per_process} x {steps} x {processes} processes)"
    )
    text = f"kl_horizon: {horizon} -> {new} ({ORIGIN}: {why})"
    set_value(edits, keys["kl_horizon"], new, Change("kl_horizon", False, text))


def method_keys(edits: Edits, keys: dict, method: str, handled: set[str]) -> None:
    """Keys of the other method (upstream declared every key for every trainer)."""
    accepted = set(keys_of(method))
    other = {name for other in ("grpo", "maxent") for name in keys_of(other)} - accepted
    for name, key in keys.items():
        if name in other and name not in handled:
            text = f"{name} (a key of the other method; this recipe trains method {method})"
            edits.comment_out(key, Change(name, True, text))
