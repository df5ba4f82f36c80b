"""Line edits of a recipe's text: its keys found with PyYAML's node marks, so every comment
and blank line of the user's stays. Each change gets a comment line above it (`# migrate: ...`);
a key with no counterpart is commented out under a line saying why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from maxent_grpo.errors import ConfigError

MARK = "# migrate:"


@dataclass(frozen=True)
class Change:
    key: str
    left_out: bool  # True: removed with no counterpart; False: translated or added
    text: str  # one line: what was done and why
    differs: bool = False  # this run trains differently from the source's (a behaviour difference)
    pinned: bool = False  # a default of the source's TRL, written out (migrate/era.py)

    def describe(self) -> str:
        return f"left out {self.text}" if self.left_out else self.text


@dataclass
class Key:
    name: str
    first: int  # line of the key
    last: int  # last line of its value
    key_node: yaml.Node
    value_node: yaml.Node


@dataclass
class Edits:
    lines: list[str]
    before: dict[int, list[str]] = field(default_factory=dict)
    after: dict[int, list[str]] = field(default_factory=dict)
    replaced: dict[int, str] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)

    def mark(self, line: int, change: Change) -> None:
        self.before.setdefault(line, []).append(f"{MARK} {change.describe()}")
        self.changes.append(change)

    def comment_out(self, key: Key, change: Change) -> None:
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


def to_yaml(value: Any) -> str:
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


def top_level_keys(text: str, source: str) -> list[Key]:
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML ({exc}); fix the syntax first") from None
    if root is None:
        return []
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{source}: a recipe must be a YAML mapping of key: value")
    return [
        Key(str(k.value), k.start_mark.line, _last_line(v), k, v)
        for k, v in root.value
        if isinstance(k, yaml.ScalarNode)
    ]


def rename_key(edits: Edits, key: Key, new: str, change: Change) -> None:
    line = edits.replaced.get(key.first, edits.lines[key.first])
    start, end = key.key_node.start_mark.column, key.key_node.end_mark.column
    edits.replaced[key.first] = line[:start] + new + line[end:]
    edits.mark(key.first, change)


def _splice_value(edits: Edits, key: Key, value: Any) -> bool:
    """Put `value` where the key's one-line value is; False when the value spans lines."""
    node = key.value_node
    if node.start_mark.line != key.first or _last_line(node) != key.first:
        return False
    line = edits.replaced.get(key.first, edits.lines[key.first])
    start, end = node.start_mark.column, node.end_mark.column
    edits.replaced[key.first] = line[:start] + to_yaml(value) + line[end:]
    return True


def set_value(edits: Edits, key: Key, value: Any, change: Change, name: str = "") -> None:
    """`name: value` in place of the key (same name by default), under a comment."""
    name = name or key.name
    if name == key.name and _splice_value(edits, key, value):
        edits.mark(key.first, change)
        return
    edits.comment_out(key, change)
    edits.after.setdefault(key.last, []).append(f"{name}: {to_yaml(value)}")
