"""`maxent-grpo migrate`: rewrite a recipe written for open-r1 / older TRL, line by line.

The recipe's text is edited where its keys are (their lines, found with PyYAML's node marks),
so every comment and blank line of the user's stays. Each change gets a comment line above it
(`# migrate: ...`); a key with no counterpart is commented out under a line saying why, and
listed. What to do with each key comes from the one table, recipe/migrations.py.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

from maxent_grpo.recipe import migrate_rules as rules
from maxent_grpo.recipe.keys import ConfigError
from maxent_grpo.recipe.migrations import (
    DEFAULT_CHANGES,
    MIGRATIONS,
    REMOVE,
    VALUE_CHANGES,
    Migration,
    ValueChange,
)

MARK = "# migrate:"
# In server mode TRL's colocate-only key would be ignored; the launcher's key sizes the server.
SERVER_MODE_RENAMES = {"vllm_gpu_memory_utilization": "vllm_server_gpu_memory_utilization"}
# Where an added key goes: after the first of these keys that the recipe has, else at the end.
_ANCHORS = {
    "vllm_mode": ("use_vllm",),
    "dataset_prompt_column": ("dataset_mixture", "dataset_config", "dataset_name"),
    "dataset_test_split": ("dataset_config", "dataset_name"),
}


@dataclass(frozen=True)
class Change:
    key: str
    left_out: bool  # True: removed with no counterpart; False: translated or added
    text: str  # one line: what was done and why
    differs: bool = False  # this run trains differently from the source's (a behaviour difference)

    def describe(self) -> str:
        return f"left out {self.text}" if self.left_out else self.text


@dataclass
class _Key:
    name: str
    first: int  # line of the key
    last: int  # last line of its value
    key_node: yaml.Node
    value_node: yaml.Node


@dataclass
class _Edits:
    lines: list[str]
    before: dict[int, list[str]] = field(default_factory=dict)
    after: dict[int, list[str]] = field(default_factory=dict)
    replaced: dict[int, str] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)

    def mark(self, line: int, change: Change) -> None:
        self.before.setdefault(line, []).append(f"{MARK} {change.describe()}")
        self.changes.append(change)

    def comment_out(self, key: _Key, change: Change) -> None:
        self.mark(key.first, change)
        for i in range(key.first, key.last + 1):
            if self.lines[i].strip():
                self.replaced[i] = "# " + self.lines[i]

    def text(self) -> str:
        out: list[str] = []
        for i, line in enumerate(self.lines):
            out += self.before.get(i, [])
            out.append(self.replaced.get(i, line))
            out += self.after.get(i, [])
        out += self.after.get(len(self.lines), [])
        return "\n".join(out) + "\n"


def _yaml(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True)
    return text.removesuffix("\n...\n").strip()


def _last_line(node: yaml.Node) -> int:
    if isinstance(node, yaml.ScalarNode) or node.flow_style:
        end = node.end_mark
        return end.line - 1 if end.column == 0 and end.line > node.start_mark.line else end.line
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    else:
        children = [n for pair in node.value for n in pair]
    return max((_last_line(child) for child in children), default=node.start_mark.line)


def _top_level_keys(text: str, source: str) -> list[_Key]:
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML ({exc}); fix the syntax first") from None
    if root is None:
        return []
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{source}: a recipe must be a YAML mapping of key: value")
    return [
        _Key(str(k.value), k.start_mark.line, _last_line(v), k, v)
        for k, v in root.value
        if isinstance(k, yaml.ScalarNode)
    ]


def _rename(edits: _Edits, key: _Key, new: str, change: Change) -> None:
    line = edits.replaced.get(key.first, edits.lines[key.first])
    start, end = key.key_node.start_mark.column, key.key_node.end_mark.column
    edits.replaced[key.first] = line[:start] + new + line[end:]
    edits.mark(key.first, change)


def _splice_value(edits: _Edits, key: _Key, value: Any) -> bool:
    """Put `value` where the key's one-line value is; False when the value spans lines."""
    node = key.value_node
    if node.start_mark.line != key.first or _last_line(node) != key.first:
        return False
    line = edits.replaced.get(key.first, edits.lines[key.first])
    start, end = node.start_mark.column, node.end_mark.column
    edits.replaced[key.first] = line[:start] + _yaml(value) + line[end:]
    return True


def _set_value(edits: _Edits, key: _Key, value: Any, change: Change, name: str = "") -> None:
    """`name: value` in place of the key (same name by default), under a comment."""
    name = name or key.name
    if name == key.name and _splice_value(edits, key, value):
        edits.mark(key.first, change)
        return
    edits.comment_out(key, change)
    edits.after.setdefault(key.last, []).append(f"{name}: {_yaml(value)}")


def _differs(m: Migration, value: Any) -> bool:
    return m.changes is not None and bool(m.changes(value))


def _migrate_key(edits: _Edits, key: _Key, value: Any, present: set[str]) -> None:
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
            text = f"{key.name}: {_yaml(value)} -> {m.target}: {_yaml(converted)} ({why})"
            _set_value(edits, key, converted, Change(key.name, False, text), m.target)
            return
    _rename(edits, key, m.target, Change(key.name, False, f"{key.name} -> {m.target} ({why})"))


def _change_value(edits: _Edits, key: _Key, recipe: dict[str, Any], rule: ValueChange) -> None:
    old, new = recipe[key.name], rule.replace(recipe[key.name])
    if new is REMOVE:
        text = f"{key.name}: {_yaml(old)} ({rule.why})"
        edits.comment_out(key, Change(key.name, True, text, rule.changes))
        del recipe[key.name]
        return
    text = f"{key.name}: {_yaml(old)} -> {_yaml(new)} ({rule.why})"
    partial = isinstance(old, list) and isinstance(new, list) and len(new) < len(old)
    _set_value(edits, key, new, Change(key.name, partial, text, rule.changes))
    recipe[key.name] = new


def _add_defaults(edits: _Edits, keys: dict[str, _Key], recipe: dict[str, Any]) -> None:
    for default in DEFAULT_CHANGES:
        if default.key in recipe or not default.applies(recipe):
            continue
        anchor = next((keys[a] for a in _ANCHORS.get(default.key, ()) if a in keys), None)
        where = anchor.last if anchor else len(edits.lines)
        text = f"{default.key}: {_yaml(default.value)} added ({default.why})"
        added = edits.after.setdefault(where, [])
        added += [f"{MARK} {text}", f"{default.key}: {_yaml(default.value)}"]
        edits.changes.append(Change(default.key, False, text))
        recipe[default.key] = default.value


def _server_mode_renames(edits: _Edits, keys: dict[str, _Key], recipe: dict[str, Any]) -> None:
    if not (recipe.get("use_vllm") is True and recipe.get("vllm_mode") == "server"):
        return
    for old, new in SERVER_MODE_RENAMES.items():
        if old in keys and new not in keys:
            why = f"{old} only sizes a colocated vLLM; the launcher starts the server with {new}"
            _rename(edits, keys[old], new, Change(old, False, f"{old} -> {new} ({why})"))


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


def _set_method(edits: _Edits, keys: dict[str, _Key], recipe: dict[str, Any]) -> set[str]:
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
            text = f"{key}: {_yaml(value)} has no counterpart ({why})"
            edits.comment_out(keys[key], Change(key, True, text, differs))
        elif key == valid[0]:
            text = f"{key}: {_yaml(value)} -> method: {method} ({why})"
            _set_value(edits, keys[key], method, Change(key, False, text, differs), "method")
        else:
            text = f"{key}: {_yaml(value)}, read with {valid[0]} as method: {method} ({why})"
            edits.comment_out(keys[key], Change(key, False, text, differs))
    return set(present)


def _maxent_beta(edits: _Edits, keys: dict[str, _Key], recipe: dict[str, Any]) -> None:
    """Upstream's MaxEnt read beta as its KL weight; here MaxEnt's is init_kl_coeff."""
    if "beta" not in keys or "init_kl_coeff" in keys or "init_kl_coef" in keys:
        return
    why = "upstream's MaxEnt KL weight was beta; here it is init_kl_coeff"
    _rename(
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
    text: str, source: str = "recipe", gpus: int | None = None
) -> tuple[str, list[Change]]:
    """The migrated recipe text and its changes, one line each (see the module docstring).

    gpus: the GPUs of the planned node, which size the translation of upstream's kl_horizon
    (optimizer steps) into completions; None: per training process.
    """
    this = sys.modules[__name__]
    keys = {k.name: k for k in _top_level_keys(text, source)}
    recipe = yaml.safe_load(text) or {}
    edits = _Edits(text.splitlines())
    handled = rules.fold_evaluation(this, edits, keys, recipe) | _set_method(edits, keys, recipe)
    present = set(keys)
    for name, key in keys.items():
        if name in MIGRATIONS and name not in handled:
            _migrate_key(edits, key, recipe[name], present)
        for rule in (r for r in VALUE_CHANGES if r.key == name and r.matches(recipe[name])):
            _change_value(edits, key, recipe, rule)
            handled.add(name)
    rules.migrate_rewards(this, edits, keys, recipe)
    rules.fixed_kl(this, edits, keys, recipe, _processes(recipe, gpus))
    method = _method(recipe)
    if method == "maxent":
        _maxent_beta(edits, keys, recipe)
    rules.method_keys(this, edits, keys, method, handled | set(MIGRATIONS))
    _add_defaults(edits, keys, recipe)
    _server_mode_renames(edits, keys, recipe)
    return edits.text(), edits.changes


def behaviour_differences(changes: list[Change]) -> list[str]:
    """The changes after which this run trains differently from the source's, one line each."""
    return [change.text for change in changes if change.differs]
