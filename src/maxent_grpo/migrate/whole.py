"""A recipe written from a whole config of another trainer (verl, prime-rl): every key of ours
with the source keys it comes from, every source key left out with what then differs.

The rule engine of YAML recipes (engine.py) edits the user's lines; a verl script or a
prime-rl TOML has no lines of ours to keep, so the recipe is written anew, one `# migrate:`
line above each key and the keys left out at the end.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Any

from maxent_grpo.migrate.edits import MARK, Change, to_yaml


@dataclass
class NewRecipe:
    origin: str  # "verl", "prime-rl"
    source: str  # the file
    values: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # our key -> where it comes from
    changes: list[Change] = field(default_factory=list)
    # builtins.set: the class's own `set` method shadows the type in the annotation's scope
    used: builtins.set[str] = field(default_factory=set)  # source keys with a fate

    def set(self, key: str, value: Any, why: str, *sources: str, differs: bool = False) -> None:
        """Our key from the source's keys (none: a value the meaning needs, said in `why`)."""
        self.values[key] = value
        self.used.update(sources)
        text = f"{', '.join(sources) or '(added)'} -> {key}: {to_yaml(value)} ({why})"
        self.notes[key] = text
        self.changes.append(Change(key, False, text, differs))

    def leave_out(self, key: str, value: Any, why: str, differs: bool = False) -> None:
        self.used.add(key)
        self.changes.append(Change(key, True, f"{key}: {to_yaml(value)} ({why})", differs))

    def missing(self, key: str, text: str) -> None:
        """A key of ours the source gives nothing for (check will name it too)."""
        self.changes.append(Change(key, True, text, True))

    def text(self) -> str:
        out = [
            f"# Written by maxent-grpo migrate from {self.source} ({self.origin}).",
            "# Each key says where it comes from; the keys left out and why are at the end.",
        ]
        for key, value in self.values.items():
            out += [f"{MARK} {self.notes[key]}", f"{key}: {to_yaml(value)}"]
        left = [c for c in self.changes if c.left_out]
        if left:
            out.append("")
            out += [f"{MARK} left out {c.text}" for c in left]
        return "\n".join(out) + "\n"
