"""`maxent-grpo migrate`: rewrite a recipe written for open-r1 / older TRL, line by line.

The recipe's text is edited where its keys are (edits.py), so every comment and blank line of
the user's stays. What to do with each key comes from the one table (this package's
__init__.py); rules.py handles what reads several keys at once.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import yaml

from maxent_grpo.errors import ConfigError
from maxent_grpo.migrate import MIGRATIONS, VALUE_CHANGES, rules
from maxent_grpo.migrate.edits import (
    MARK,
    Change,
    Edits,
    Key,
    rename_key,
    set_value,
    to_yaml,
    top_level_keys,
)
from maxent_grpo.migrate.entropy import migrate_entropy_bonus
from maxent_grpo.migrate.era import era_pins, recipe_era
from maxent_grpo.migrate.kinds import REMOVE, Migration, ValueChange
from maxent_grpo.migrate.layout import UPSTREAM_TRAINERS, fit_eval, fit_layout, fit_train
from maxent_grpo.migrate.open_r1 import DEFAULT_CHANGES
from maxent_grpo.migrate.upstream import ORIGIN as UPSTREAM
from maxent_grpo.recipe.needs import ATTENTION_FALLBACK, ATTENTION_PACKAGES

# In server mode TRL's colocate-only key would be ignored; the launcher's key sizes the server.
SERVER_MODE_RENAMES = {"vllm_gpu_memory_utilization": "vllm_server_gpu_memory_utilization"}
# Where an added key goes: after the first of these keys that the recipe has, else at the end.
_ANCHORS = {
    "vllm_mode": ("use_vllm",),
    "dataset_prompt_column": ("dataset_mixture", "dataset_config", "dataset_name"),
    "dataset_test_split": ("dataset_config", "dataset_name"),
}


def _differs(m: Migration, value: Any) -> bool:
    return m.changes is not None and bool(m.changes(value))


def _migrate_key(edits: Edits, key: Key, value: Any, present: set[str]) -> None:
    m: Migration = MIGRATIONS[key.name]
    why = f"{m.origin}: {m.why}"
    if m.action == "fold":
        return  # folded by its rule (_fold_evaluation, _migrate_rewards)
    if m.action == "remove":
        edits.comment_out(key, Change(key.name, True, f"{key.name} ({why})", _differs(m, value)))
        return
    if m.target in present:
        text = f"{key.name}: {m.target} is set too ({why})"
        edits.comment_out(key, Change(key.name, True, text))
        return
    present.add(m.target)
    if m.action == "convert":
        try:
            converted = m.convert(value)
        except (TypeError, ValueError) as exc:
            text = f"{key.name}: {exc} ({why})"
            edits.comment_out(key, Change(key.name, True, text, _differs(m, value)))
            present.discard(m.target)
            return
        if converted != value:
            text = f"{key.name}: {to_yaml(value)} -> {m.target}: {to_yaml(converted)} ({why})"
            set_value(edits, key, converted, Change(key.name, False, text), m.target)
            return
    rename_key(edits, key, m.target, Change(key.name, False, f"{key.name} -> {m.target} ({why})"))


def _change_value(edits: Edits, key: Key, recipe: dict[str, Any], rule: ValueChange) -> None:
    old, new = recipe[key.name], rule.replace(recipe[key.name])
    if new is REMOVE:
        text = f"{key.name}: {to_yaml(old)} ({rule.why})"
        edits.comment_out(key, Change(key.name, True, text, rule.changes))
        del recipe[key.name]
        return
    text = f"{key.name}: {to_yaml(old)} -> {to_yaml(new)} ({rule.why})"
    partial = isinstance(old, list) and isinstance(new, list) and len(new) < len(old)
    set_value(edits, key, new, Change(key.name, partial, text, rule.changes))
    recipe[key.name] = new


def _add_defaults(edits: Edits, keys: dict[str, Key], recipe: dict[str, Any]) -> None:
    for default in DEFAULT_CHANGES:
        if default.key in recipe or not default.applies(recipe):
            continue
        anchor = next((keys[a] for a in _ANCHORS.get(default.key, ()) if a in keys), None)
        where = anchor.last if anchor else len(edits.lines)
        text = f"{default.key}: {to_yaml(default.value)} added ({default.why})"
        added = edits.after.setdefault(where, [])
        added += [f"{MARK} {text}", f"{default.key}: {to_yaml(default.value)}"]
        edits.changes.append(Change(default.key, False, text))
        recipe[default.key] = default.value


def _pin_era_defaults(edits: Edits, method: str, era: tuple[str, str] | None) -> None:
    """The defaults of the recipe's TRL that changed since, written out at the end."""
    if era is None:
        return
    version, known_by = era
    now = yaml.safe_load(edits.text()) or {}  # the keys after every rename and addition
    where = edits.after.setdefault(len(edits.lines), [])
    for row in era_pins(now, method, version):
        text = (
            f"{row.key}: {to_yaml(row.value)} added (default of TRL {version}, {known_by}; "
            f"TRL 1.16: {to_yaml(row.now)}; {row.why})"
        )
        where += [f"{MARK} {text}", f"{row.key}: {to_yaml(row.value)}"]
        edits.changes.append(Change(row.key, False, text, pinned=True))


def _attention_fallback(edits: Edits, keys: dict[str, Key], recipe: dict[str, Any]) -> None:
    """flash-attn is in no extra (it builds against the node's CUDA): where this environment
    lacks it, the swap `check` asks for, to PyTorch's kernel of the same attention."""
    value = recipe.get("attn_implementation")
    if value not in ATTENTION_PACKAGES or importlib.util.find_spec(ATTENTION_PACKAGES[value]):
        return
    why = (
        f"{ATTENTION_PACKAGES[value]} is in no extra of this toolkit and this environment lacks "
        "it; sdpa computes the same attention; keep the old value where the job's environment "
        "has the package"
    )
    text = f"attn_implementation: {value} -> {ATTENTION_FALLBACK} ({why})"
    change = Change("attn_implementation", False, text)
    set_value(edits, keys["attn_implementation"], ATTENTION_FALLBACK, change)
    recipe["attn_implementation"] = ATTENTION_FALLBACK


def _server_mode_renames(edits: Edits, keys: dict[str, Key], recipe: dict[str, Any]) -> None:
    if not (recipe.get("use_vllm") is True and recipe.get("vllm_mode") == "server"):
        return
    for old, new in SERVER_MODE_RENAMES.items():
        if old in keys and new not in keys:
            why = f"{old} only sizes a colocated vLLM; the launcher starts the server with {new}"
            rename_key(edits, keys[old], new, Change(old, False, f"{old} -> {new} ({why})"))


_METHOD_KEYS = ("objective", "train_grpo_objective", "maxent_objective_variant")


def _converted_method(key: str, value: Any) -> str | None:
    try:
        return MIGRATIONS[key].convert(value)
    except (TypeError, ValueError):
        return None


def _method(recipe: dict[str, Any]) -> str:
    """The recipe's method after migration: its `method:`, else upstream's objective, else
    train_grpo_objective: true, else maxent_objective_variant, else grpo."""
    if recipe.get("method") in ("grpo", "maxent"):
        return recipe["method"]
    flag = recipe.get("train_grpo_objective")
    candidates = (
        _converted_method("objective", recipe["objective"]) if "objective" in recipe else None,
        "grpo" if flag is True else None,
        _converted_method("maxent_objective_variant", recipe["maxent_objective_variant"])
        if "maxent_objective_variant" in recipe
        else None,
        "maxent" if flag is False else None,
    )
    return next((m for m in candidates if m), "grpo")


def _set_method(edits: Edits, keys: dict[str, Key], recipe: dict[str, Any]) -> set[str]:
    """Upstream's objective keys -> one `method:` line (at the first of them)."""
    present = [k for k in _METHOD_KEYS if k in keys]
    if not present or "method" in keys:
        return set()
    method = _method(recipe)
    valid = [k for k in present if _converted_method(k, recipe[k]) is not None]
    for key in present:
        m, value = MIGRATIONS[key], recipe[key]
        why = f"{m.origin}: {m.why}"
        differs = _differs(m, value)
        if _converted_method(key, value) is None:
            text = f"{key}: {to_yaml(value)} has no counterpart ({why})"
            edits.comment_out(keys[key], Change(key, True, text, differs))
        elif key == valid[0]:
            text = f"{key}: {to_yaml(value)} -> method: {method} ({why})"
            set_value(edits, keys[key], method, Change(key, False, text, differs), "method")
        else:
            text = f"{key}: {to_yaml(value)}, read with {valid[0]} as method: {method} ({why})"
            edits.comment_out(keys[key], Change(key, False, text, differs))
    return set(present)


def _maxent_beta(edits: Edits, keys: dict[str, Key], recipe: dict[str, Any]) -> None:
    """Upstream's MaxEnt read beta as its KL weight; here MaxEnt's is init_kl_coeff."""
    if "beta" not in keys or "init_kl_coeff" in keys or "init_kl_coef" in keys:
        return
    why = "upstream's MaxEnt KL weight was beta; here it is init_kl_coeff"
    rename_key(
        edits,
        keys["beta"],
        "init_kl_coeff",
        Change("beta", False, f"beta -> init_kl_coeff ({why})"),
    )


def _processes(recipe: dict[str, Any], gpus: int | None) -> int:
    """Training processes on `gpus` GPUs: the vLLM server's GPUs (server mode) do not train."""
    if gpus is None:
        return 1
    server = recipe.get("use_vllm") is True and recipe.get("vllm_mode", "server") == "server"
    tp = recipe.get("vllm_tensor_parallel_size", 1)
    return max(gpus - (tp if server and isinstance(tp, int) else 0), 1)


def migrate_text(
    text: str, source: str = "recipe", gpus: int | None = None, trl_version: str | None = None
) -> tuple[str, list[Change]]:
    """The migrated recipe text and its changes, one line each (see the module docstring).

    gpus: the GPUs of the planned node, which size the translation of upstream's kl_horizon
    (optimizer steps) into completions; None: per training process.
    trl_version: the TRL the recipe was written for (None: read from its source and keys).
    """
    keys = {k.name: k for k in top_level_keys(text, source)}
    recipe = yaml.safe_load(text) or {}
    upstream = any(MIGRATIONS[k].origin == UPSTREAM for k in keys if k in MIGRATIONS)
    try:
        era = recipe_era(recipe, upstream, trl_version)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    edits = Edits(text.splitlines())
    handled = rules.fold_evaluation(edits, keys, recipe) | _set_method(edits, keys, recipe)
    handled |= migrate_entropy_bonus(edits, keys, recipe)
    present = set(keys)
    for name, key in keys.items():
        if name in MIGRATIONS and name not in handled:
            _migrate_key(edits, key, recipe[name], present)
        for rule in (r for r in VALUE_CHANGES if r.key == name and r.matches(recipe[name])):
            _change_value(edits, key, recipe, rule)
            handled.add(name)
    rules.migrate_rewards(edits, keys, recipe)
    processes = _processes(recipe, gpus)
    if upstream and gpus is not None:  # upstream's batch keys were written for 6 trainers
        processes = fit_layout(edits, keys, recipe, processes)
    if gpus is not None:  # the global batches, on the planned processes
        source = UPSTREAM_TRAINERS if upstream else processes
        fit_train(edits, keys, recipe, processes, source)
        fit_eval(edits, keys, recipe, processes, source)
    rules.fixed_kl(edits, keys, recipe, processes)
    method = _method(recipe)
    if method == "maxent":
        _maxent_beta(edits, keys, recipe)
    rules.method_keys(edits, keys, method, handled | set(MIGRATIONS))
    _add_defaults(edits, keys, recipe)
    _server_mode_renames(edits, keys, recipe)
    _attention_fallback(edits, keys, recipe)
    _pin_era_defaults(edits, method, era)
    return edits.text(), edits.changes


def behaviour_differences(changes: list[Change]) -> list[str]:
    """The changes after which this run trains differently from the source's, one line each."""
    return [change.text for change in changes if change.differs]


def default_drift(changes: list[Change]) -> list[str]:
    """The defaults that changed since the source's TRL, pinned to the old value, one line each:
    without them this run would train differently (delete a line to take TRL 1.16's)."""
    return [change.text for change in changes if change.pinned]
