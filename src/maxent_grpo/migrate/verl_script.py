"""A verl run as dotted keys: the Hydra overrides of `python3 -m verl.trainer.main_ppo` in a shell
script (its own variables resolved, line continuations joined, quoting as the shell reads it),
or a verl YAML config (nested keys flattened). Pure: the environment is an argument.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from maxent_grpo.errors import ConfigError

ENTRY = "verl.trainer.main_ppo"
_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VAR = re.compile(
    r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*|@|\*))"
)
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def is_verl_script(text: str) -> bool:
    return ENTRY in text


def _logical_lines(text: str) -> list[str]:
    """Lines with backslash-newline continuations joined and comment lines dropped."""
    joined = re.sub(r"\\\s*\n", " ", text)
    return [line.strip() for line in joined.splitlines() if not line.strip().startswith("#")]


def _expand(text: str, variables: Mapping[str, str], source: str) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        if name in ("@", "*"):
            return ""  # the script's own arguments: none when migrating
        if name in variables:
            return variables[name]
        if match.group(2) is not None:
            return _expand(match.group(2), variables, source)
        raise ConfigError(
            f"{source}: ${name} is not set in the script or the environment; set it (e.g. "
            f"{name}=... maxent-grpo migrate {source}) or write its value into the script"
        )

    return _VAR.sub(value, text)


def shell_words(line: str, variables: Mapping[str, str], source: str) -> list[str]:
    """The words of one shell line: quotes removed, variables expanded outside single quotes."""
    words: list[str] = []
    current, quote, started, i = "", "", False, 0
    while i < len(line):
        char = line[i]
        if quote == "'":
            end = line.find("'", i)
            end = len(line) if end < 0 else end
            current, quote, i = current + line[i:end], "", end + 1
            continue
        if char in "'\"" and (not quote or quote == char):
            quote = "" if quote else char
            started, i = True, i + 1
            continue
        if char == "\\" and i + 1 < len(line):
            current, started, i = current + line[i + 1], True, i + 2
            continue
        if char == "$" and quote != "'":
            match = _VAR.match(line, i)
            if match:
                current += _expand(match.group(0), variables, source)
                started, i = started or bool(quote), match.end()  # "$EMPTY" is a word
                continue
        if char.isspace() and not quote:
            if current or started:
                words.append(current)
            current, started, i = "", False, i + 1
            continue
        if char == "#" and not quote and not current and not started:
            break
        current, i = current + char, i + 1
    if current or started:
        words.append(current)
    return words


def hydra_value(text: str) -> Any:
    """A Hydra override's value as verl reads it: numbers, booleans, null, lists, strings."""
    if _NUMBER.match(text):
        return float(text) if any(c in text for c in ".eE") else int(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.lower() in ("null", "none", "~"):
        return None
    if text.startswith("[") and text.endswith("]"):
        try:
            items = yaml.safe_load(text)
        except yaml.YAMLError:
            return text
        return [hydra_value(str(v)) if isinstance(v, str) else v for v in items]
    return text


def read_script(text: str, environ: Mapping[str, str], source: str) -> dict[str, Any]:
    """The overrides of the script's verl command, by dotted key."""
    variables = dict(environ)
    for line in _logical_lines(text):
        if ENTRY in line:
            words = shell_words(line, variables, source)
            start = words.index(ENTRY) + 1 if ENTRY in words else len(words)
            return _overrides(words[start:], source)
        match = _ASSIGN.match(line)
        if match:
            words = shell_words(match.group(2), variables, source)
            variables[match.group(1)] = " ".join(words)
    raise ConfigError(f"{source}: no `python3 -m {ENTRY}` command found")


def _overrides(words: list[str], source: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for word in words:
        if word.startswith("--") or word.startswith("~") or "=" not in word:
            continue  # --config-name/--config-path, deletions, stray words: no override
        key, _, value = word.lstrip("+").partition("=")
        found[key] = hydra_value(value)
    if not found:
        raise ConfigError(f"{source}: the {ENTRY} command has no key=value overrides")
    return found


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A verl YAML config by dotted key (interpolations `${...}` are verl's defaults: skipped)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, name + "."))
        elif not (isinstance(value, str) and value.startswith("${")):
            flat[name] = value
    return flat


def is_verl_config(data: Any) -> bool:
    return isinstance(data, Mapping) and "actor_rollout_ref" in data
