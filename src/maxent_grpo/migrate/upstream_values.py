"""Upstream MaxEnt-GRPO's values here: the converters of its rows (upstream.py), its values
with no counterpart (migrate replaces them), and its keys that mean the same here (kept).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from maxent_grpo.migrate.kinds import REMOVE, ValueChange, is_number

_LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "0.0.0.0", "::1"}


def loss_type(value: Any) -> str:
    """grpo_loss_type -> loss_type: upstream's three aggregations are TRL's of the same name."""
    name = str(value).strip().lower()
    if name not in ("grpo", "bnpo", "dr_grpo"):
        raise ValueError(f"{value!r} is not one of upstream's grpo, bnpo, dr_grpo")
    return name


def server_url(value: Any) -> str:
    """vllm_url (upstream's /generate endpoint) -> vllm_server_base_url (the server's root)."""
    url = urlparse(str(value).strip())
    if url.hostname in _LOCAL_HOSTS or url.hostname is None:
        raise ValueError(
            f"{value} is the server upstream's Slurm helper started beside the trainers; the "
            "launcher starts its own vLLM server and connects to it"
        )
    return f"{url.scheme or 'http'}://{url.netloc}"


_OBJECTIVES = {
    "grpo": "grpo",
    "grpo_entropy_bonus": "grpo",
    "maxent_listwise": "maxent",
    "maxent_entropy": "grpo",
}


def method_of_objective(value: Any) -> str:
    """objective -> method: listwise MaxEnt is method maxent; the entropy-bonus objectives
    train GRPO here with TRL's entropy bonus (migrate/entropy.py)."""
    name = str(value).strip().lower()
    if name not in _OBJECTIVES:
        raise ValueError(f"objective {value!r} has no counterpart (grpo or maxent_listwise)")
    return _OBJECTIVES[name]


def method_of_flag(value: Any) -> str:
    return "grpo" if value is True else "maxent"


def method_of_variant(value: Any) -> str:
    """maxent_objective_variant -> method: listwise weights are method maxent; the entropy
    loss is GRPO with TRL's entropy bonus (method grpo, migrate/entropy.py)."""
    name = str(value).strip().lower()
    if name not in ("listwise", "entropy"):
        raise ValueError(f"maxent_objective_variant {value!r} is neither listwise nor entropy")
    return "maxent" if name == "listwise" else "grpo"


def mixup_alpha(value: Any) -> float:
    """maxent_reference_ema_beta (the old reference's share) -> TRL's ref_model_mixup_alpha
    (the policy's share)."""
    if not is_number(value) or not 0 <= value < 1:
        raise ValueError(f"an EMA beta of {value!r} is not in [0, 1)")
    return round(1 - value, 12)


def dataset_config(value: Any) -> Any:
    """Older open-r1's dataset_configs (a list) -> dataset_config (one name)."""
    configs = value if isinstance(value, list) else [value]
    if len(configs) != 1:
        raise ValueError(
            f"{len(configs)} configurations; name each in a dataset_mixture entry instead"
        )
    return configs[0]


_LOG_LEVELS = ((50, "critical"), (40, "error"), (30, "warning"), (20, "info"), (10, "debug"))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _log_level_name(value: int) -> str:
    """Python's numeric level -> transformers' name (the nearest one at or below it)."""
    return next((name for number, name in _LOG_LEVELS if value >= number), "debug")


VALUE_CHANGES = (
    ValueChange(
        "log_level",
        "a number (upstream: 20, 30)",
        "its name (info, warning)",
        "transformers reads log_level by name; upstream read Python's numeric levels",
        _is_int,
        _log_level_name,
    ),
    *(
        ValueChange(
            key,
            "0 or less (upstream: no bound)",
            "left out (the default bound)",
            "upstream read 0 as no bound; here a bound must be > 0 and the default applies",
            lambda value: is_number(value) and value <= 0,
            lambda value: REMOVE,
        )
        for key in ("maxent_tau_min", "maxent_tau_max")
    ),
    ValueChange(
        "maxent_tau",
        "0 (upstream: no entropy weight)",
        "left out (the default maxent_tau)",
        "MaxEnt here needs tau > 0; upstream's tau 0 weighted by the rewards alone",
        lambda value: is_number(value) and value <= 0,
        lambda value: REMOVE,
        changes=True,
    ),
)


#: Upstream keys that are keys here too, with upstream's meaning, which migrate keeps as they
#: are (the parser reads them). Each row is (key, what it does here); the docs list them.
KEPT = (
    (
        "reference_model_name_or_path",
        "the KL reference when beta > 0, instead of a frozen copy of the starting policy; "
        "its tokenizer must have the policy's vocabulary (checked before the models load)",
    ),
    ("reference_model_revision", "the hub revision of reference_model_name_or_path"),
    (
        "vllm_sync_interval_steps",
        "the weights go to the vLLM server every N optimizer steps, as upstream's; with N > 1 "
        "TRL's importance-sampling correction (required) reweights the older policy's samples",
    ),
    (
        "prompt_template",
        "upstream's named templates (r1, qwen_math, no) or a text with {prompt} (and {system}), "
        "sent as a plain-text prompt; upstream's r1 also stopped generation at </answer>, which "
        "here is vllm_stop_sequences' difference",
    ),
)
