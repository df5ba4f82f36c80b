"""The source's GPU layout (issue 42 item 3): upstream MaxEnt-GRPO's guide ran its vLLM server on
GPU 0 and trained on GPUs 1-6, so its batch keys were written for 6 training processes. On the
planned node (`migrate --gpus N`) the same keys may not divide into whole groups; migrate then
changes the fewest keys that keep the completions per optimizer step, or, when no such change
exists, plans upstream's own layout (num_processes: 6)."""

from __future__ import annotations

from typing import Any

from maxent_grpo.migrate.edits import MARK, Change, Edits, Key, set_value, to_yaml
from maxent_grpo.migrate.refit import refit_eval, refit_train
from maxent_grpo.migrate.upstream import ORIGIN

#: Training processes of upstream's layout (1 server and 6 trainers on 7 GPUs).
UPSTREAM_TRAINERS = 6


def _int(recipe: dict[str, Any], key: str, default: int) -> int | None:
    value = recipe.get(key, default)
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None


def batch_fix(recipe: dict[str, Any], processes: int) -> dict[str, int]:
    """The fewest keys to change so that processes train whole groups with upstream's
    completions per optimizer step ({} when they already do; num_processes: 6 when no batch
    change keeps them)."""
    batch = _int(recipe, "per_device_train_batch_size", 8)
    steps = _int(recipe, "gradient_accumulation_steps", 1)
    group = _int(recipe, "num_generations", 8)
    if (
        None in (batch, steps, group)
        or "num_processes" in recipe
        or "steps_per_generation" in recipe
    ):
        return {}
    if (batch * processes * steps) % group == 0 or processes == UPSTREAM_TRAINERS:
        return {}
    per_step = batch * UPSTREAM_TRAINERS * steps  # upstream's completions per optimizer step
    if per_step % (batch * processes) == 0:
        return {"gradient_accumulation_steps": per_step // (batch * processes)}
    if per_step % (processes * steps) == 0:
        return {"per_device_train_batch_size": per_step // (processes * steps)}
    return {"num_processes": UPSTREAM_TRAINERS}


def _write(edits: Edits, keys: dict[str, Key], key: str, value: int, change: Change) -> None:
    if key in keys:
        set_value(edits, keys[key], value, change)
        return
    edits.after.setdefault(len(edits.lines), []).extend(
        [f"{MARK} {change.text}", f"{key}: {value}"]
    )
    edits.changes.append(change)


def fit_layout(edits: Edits, keys: dict[str, Key], recipe: dict[str, Any], processes: int) -> int:
    """Apply batch_fix; returns the training processes of the result."""
    fix = batch_fix(recipe, processes)
    for key, value in fix.items():
        if key == "num_processes":
            why = (
                f"upstream trained on {UPSTREAM_TRAINERS} processes (server on GPU 0, training "
                f"on GPUs 1-6) and its batch keys make whole groups of num_generations there, "
                f"not on {processes}: its layout is kept, the other GPUs stay idle"
            )
            _write(
                edits,
                keys,
                key,
                value,
                Change(key, False, f"num_processes: {value} added ({ORIGIN}: {why})"),
            )
            return value
        why = (
            f"upstream's {UPSTREAM_TRAINERS} training processes made whole groups; on "
            f"{processes} this keeps its completions per optimizer step"
        )
        text = f"{key}: {to_yaml(recipe.get(key))} -> {value} ({ORIGIN}: {why})"
        _write(edits, keys, key, value, Change(key, False, text))
        recipe[key] = value
    return processes


def fit_eval(
    edits: Edits, keys: dict[str, Key], recipe: dict[str, Any], processes: int, source: int
) -> None:
    """The evaluation batch re-fit to `processes` (refit.py): the source's completions per
    evaluation batch (per_device_eval_batch_size x its `source` processes) in whole groups of
    the evaluation's num_generations, or the nearest, with the arithmetic in the change."""
    if recipe.get("eval_strategy", "no") in (None, "no") or recipe.get("do_eval") is False:
        return
    size = _int(recipe, "per_device_eval_batch_size", 8)
    group = _int(recipe, "num_generations_eval", 0) or _int(recipe, "num_generations", 8)
    if None in (size, group) or (size * processes) % group == 0:
        return
    new, _, line = refit_eval(size * source, group, processes)
    why = f"TRL evaluates whole groups of {group} on {processes} processes: {line}"
    text = f"per_device_eval_batch_size: {size} -> {new} ({why})"
    _write(
        edits,
        keys,
        "per_device_eval_batch_size",
        new,
        Change("per_device_eval_batch_size", False, text),
    )
    recipe["per_device_eval_batch_size"] = new


def fit_train(
    edits: Edits, keys: dict[str, Key], recipe: dict[str, Any], processes: int, source: int
) -> None:
    """The training batch re-fit to `processes` (refit.py) where the recipe's keys make no
    whole groups there: the source's completions per optimizer step (per-device batch x its
    `source` processes x accumulation), per generation the same (TRL's default), or the nearest
    whole groups, with the arithmetic in the changes."""
    batch = _int(recipe, "per_device_train_batch_size", 8)
    steps = _int(recipe, "gradient_accumulation_steps", 1)
    group = _int(recipe, "num_generations", 8)
    if None in (batch, steps, group) or {"steps_per_generation", "generation_batch_size"} & set(
        recipe
    ):
        return
    if (batch * processes * steps) % group == 0:
        return
    per_step = batch * source * steps
    fit = refit_train(per_step, per_step, group, processes, cap=batch)
    why = f"TRL trains whole groups of {group} on {processes} processes: " + "; ".join(fit.lines)
    new = {
        "per_device_train_batch_size": fit.per_device,
        "gradient_accumulation_steps": fit.accumulation,
        "steps_per_generation": fit.steps_per_generation,
    }
    for key, value in new.items():
        if recipe.get(key) != value:
            text = f"{key}: {to_yaml(recipe.get(key))} -> {value} ({why})"
            _write(edits, keys, key, value, Change(key, False, text, not fit.exact))
            recipe[key] = value
