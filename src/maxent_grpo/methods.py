"""The training methods, in one place: their names, labels and entry scripts.

Used by the command line (`--method` choices), the recipe parser (which method a recipe has),
the launcher (which entry point to start) and `maxent-grpo runs` (labels). A leaf: standard
library only, cheap for the launcher. What a method is made of is named where it is chosen:
its recipe sections in recipe/sections.py (`SECTIONS`, imports TRL), its trainer class in
train_process.py (`trainer_class`, the trainer process only).

A recipe may declare its method (`method: maxent`, `method: sft`); `--method` / MAXENT=1 may
ask for one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.errors import ConfigError

DEFAULT_METHOD = "grpo"
# `python -m maxent_grpo.train --method M --config R`: works from any install.
TRAIN_MODULE = "maxent_grpo.train"
# Where the repository keeps the thin entry scripts (src/grpo.py ...): an editable install.
_SRC_DIR = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Method:
    name: str
    label: str  # how tables and plots name it
    script: str  # its thin entry script under src/ (the product promises these)

    def entry(self) -> tuple[str, ...]:
        """What `accelerate launch` runs: the entry script in a source checkout, else the module.

        The script keeps process listings and plans readable (`.../src/grpo.py`); the module
        form works from an installed (non-editable) package, where there is no src/.
        """
        script = _SRC_DIR / self.script
        if script.is_file():
            return (str(script),)
        return ("--module", TRAIN_MODULE, "--method", self.name)


METHODS: dict[str, Method] = {
    "grpo": Method(name="grpo", label="GRPO", script="grpo.py"),
    "maxent": Method(name="maxent", label="MaxEnt", script="maxent-grpo.py"),
    # Supervised fine-tuning (TRL's SFTTrainer): no rewards, no vLLM server (docs/sft.md).
    "sft": Method(name="sft", label="SFT", script="sft.py"),
}

# Methods that generate completions (GRPO's family): rewards, a vLLM server, num_generations.
RL_METHODS = frozenset({"grpo", "maxent"})


def uses_vllm_server(values) -> bool:
    """Whether a recipe generates on a vLLM server (`use_vllm: true`, `vllm_mode: server`): the
    one spelling of it. values: RecipeKeys, or the trainers' built config (TRL's args)."""
    return bool(getattr(values, "use_vllm", False)) and values.vllm_mode == "server"


def rollouts_on(values) -> bool:
    """Rollout filters, generation rounds or over-sampling (train/rollout_rounds.py): the one
    spelling of it. values: RecipeKeys, or the trainers' built config."""
    return bool(values.rollout_filters) or (
        values.max_generation_rounds > 1 or values.oversample_factor > 1.0
    )


def async_depth(values) -> int:
    """Steps async_generation generates ahead: as many as keep every sample within
    max_staleness, given that weights are pushed every vllm_sync_interval_steps."""
    return max(1, values.max_staleness - values.vllm_sync_interval_steps + 1)


def resolve_method(requested: str | None, declared: str | None, source: str) -> str:
    """The method of a run: the one asked for, the recipe's `method:` key, else grpo.

    Asking for one method while the recipe declares another is a one-line error.
    """
    if requested is not None and requested not in METHODS:
        raise ConfigError(f"--method {requested!r}: expected one of {', '.join(METHODS)}")
    if requested and declared and requested != declared:
        raise ConfigError(
            f"{source}: the recipe says method: {declared} but --method {requested} was asked "
            "for; drop --method (or MAXENT=1) or change the recipe's method"
        )
    return requested or declared or DEFAULT_METHOD
