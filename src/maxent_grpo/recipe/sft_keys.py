"""The sections of an SFT recipe (`method: sft`): the data keys of ScriptArguments, TRL's
SFTConfig plus the keys our trainer process reads, ModelConfig and LauncherKeys.

An SFT run trains on each row's answer (dataset_answer_column) as the assistant's reply to its
prompt (docs/sft.md): it scores nothing and generates nothing, so the GRPO keys (rewards,
tools, num_generations, vLLM) are not keys of an SFT recipe; the parser names the method they
belong to (recipe/parser.py). Each key keeps its one declaration: the data keys are
ScriptArguments' own fields, the shared trainer keys are GRPOConfig's.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

import trl
from trl import ModelConfig

from maxent_grpo.recipe.keys import GRPOConfig, LauncherKeys, ScriptArguments
from maxent_grpo.recipe.rules import check_rules

# ScriptArguments' keys that an SFT run reads: where its rows come from and how the prompt is
# written. Rewards, tools and benchmarks score generated completions: GRPO's.
_DATA_KEYS = (
    "dataset_name",
    "dataset_config",
    "dataset_train_split",
    "dataset_test_split",
    "dataset_mixture",
    "dataset_prompt_column",
    "dataset_answer_column",
    "dataset_num_rows",
    "dataset_seed",
    "system_prompt",
    "prompt_template",
)
# Our GRPOConfig keys that the trainer process reads for every method (train/entry.py).
_SHARED_TRAINING_KEYS = ("chat_template", "wandb_entity", "wandb_project", "wandb_run_group")


def _copied_fields(source: type, names: tuple[str, ...]) -> list[tuple[str, object, object]]:
    """`names`' fields of the dataclass `source` (type with its Annotated range, default,
    help): the same declaration, in another section."""
    hints = typing.get_type_hints(source, include_extras=True)
    found = {f.name: f for f in dataclasses.fields(source)}
    return [
        (
            name,
            hints[name],
            dataclasses.field(
                default=found[name].default,
                default_factory=found[name].default_factory,
                metadata=found[name].metadata,
            ),
        )
        for name in names
    ]


def _check_answers(self) -> None:
    check_rules(self, None, "sft")


SFTScriptArguments = dataclasses.make_dataclass(
    "SFTScriptArguments",
    _copied_fields(ScriptArguments, _DATA_KEYS),
    namespace={"__post_init__": _check_answers},
)
SFTScriptArguments.__module__ = __name__
SFTScriptArguments.__doc__ = "ScriptArguments' data keys: what an SFT run trains on."


_Shared = dataclasses.make_dataclass("_Shared", _copied_fields(GRPOConfig, _SHARED_TRAINING_KEYS))


@dataclass
class SFTConfig(trl.SFTConfig, _Shared):
    """TRL's SFTConfig plus the keys every method's trainer process reads."""


SFT_TYPES = (SFTScriptArguments, SFTConfig, ModelConfig, LauncherKeys)
