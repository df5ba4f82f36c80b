"""Recipe checks: one function per rule, one-line ConfigErrors, run on every path.

- check_ranges: every declared range (recipe/declare.py; carried by schema.json), on the
  parsed keys.
- batch_for_processes: the GRPO batch arithmetic (training and evaluation) for an explicit
  number of processes.
- check_keys: the launcher's checks on the values alone (batch arithmetic, model path, output
  dir, launcher files, and every rule across keys of recipe/rules.py, which each trainer runs
  on its section too): no TRL, torch or datasets, on every attempt, plan, sbatch and submit.
- the rules of the built recipe that need nothing above recipe/ (model path, output dir,
  launcher files); `preflight.py` runs them with the rules that need data/ and rewards/
  (check_recipe).

Each rule raises its own one-line ConfigError; the functions that run several rules collect
their problems (recipe/problems.py), so a recipe's every problem is reported in one pass.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from maxent_grpo.errors import ConfigError, ConfigProblems
from maxent_grpo.methods import uses_vllm_server
from maxent_grpo.recipe import schema
from maxent_grpo.recipe.declare import describe, in_range
from maxent_grpo.recipe.problems import Problems, collecting
from maxent_grpo.recipe.rules import check_rules

if TYPE_CHECKING:
    from maxent_grpo.recipe.parser import RecipeKeys


def check_ranges(keys: RecipeKeys) -> None:
    """Every key with a declared range that is set lies in it (None: unset).

    The ranges are read from the committed schema (recipe/schema.py): no TRL import here."""
    with collecting(keys.path) as problems:
        for key, rule in schema.ranges().items():
            value = keys.values.get(key)
            if value is None or isinstance(value, (str, list, dict)):
                continue  # unset, or a type problem reported by the parser already
            if not in_range(value, rule):
                want = describe(rule)
                problems.add(
                    f"{keys.path}: key '{key}': {value!r} is invalid (must be {want}); set "
                    f"{key} to a value {want}",
                    [key],
                )


def _multiple_at_least(value: int, step: int) -> int:
    return -(-value // step) * step


def check_batch_arithmetic(
    per_device_train_batch_size: int,
    num_processes: int,
    steps_per_generation: int,
    num_generations: int,
    hint: str = "",
) -> None:
    """GRPO groups completions by prompt: a generation batch must hold whole groups.

    hint: appended to the fix (see `server_mode_hint`).
    """
    completions = per_device_train_batch_size * num_processes * steps_per_generation
    if num_generations < 2:
        raise ConfigError(
            f"num_generations: {num_generations}: GRPO needs at least 2 completions per prompt; "
            "set num_generations: 2 or more"
        )
    if completions % num_generations:
        step = num_generations // math.gcd(num_generations, num_processes * steps_per_generation)
        raise ConfigError(
            f"per_device_train_batch_size ({per_device_train_batch_size}) x processes "
            f"({num_processes}) x steps_per_generation ({steps_per_generation}) = {completions} "
            f"completions per generation batch, not divisible by num_generations "
            f"({num_generations}); set per_device_train_batch_size: "
            f"{_multiple_at_least(per_device_train_batch_size, step)} or change "
            f"num_generations{hint}"
        )


def check_eval_batch(
    per_device_eval_batch_size: int, num_processes: int, num_generations: int, hint: str = ""
) -> None:
    """With evaluation on, TRL's evaluation batch must hold whole groups too (for N processes:
    TRL checks it for the process that builds the config, 1 in the launcher)."""
    completions = per_device_eval_batch_size * num_processes
    if completions % num_generations:
        step = num_generations // math.gcd(num_generations, num_processes)
        raise ConfigError(
            f"per_device_eval_batch_size ({per_device_eval_batch_size}) x processes "
            f"({num_processes}) = {completions} completions per evaluation batch, not divisible "
            f"by the evaluation's num_generations ({num_generations}); set "
            f"per_device_eval_batch_size: {_multiple_at_least(per_device_eval_batch_size, step)} "
            f"(or num_generations_eval), or turn evaluation off (eval_strategy: 'no'){hint}"
        )


def server_mode_hint(values: dict[str, Any]) -> str:
    """For a batch that fails: a recipe written for a vLLM GPU of its own (open-r1's 7 + 1) that
    does not say vllm_mode: server trains on every GPU (TRL's default is colocate)."""
    if values.get("use_vllm") and not uses_vllm_server(SimpleNamespace(**values)):
        return (
            "; or, if the recipe was written for vLLM on a GPU of its own (e.g. 7 training + 1 "
            "vLLM GPU), set vllm_mode: server: with TRL's default, colocate, every GPU trains"
        )
    return ""


def _evaluation_asked(values: dict[str, Any]) -> bool:
    strategy = values.get("eval_strategy") or "no"
    return str(getattr(strategy, "value", strategy)) != "no"


def _has_test_split(values: dict[str, Any]) -> bool:
    """The trainer evaluates the `test` split of the recipe's data (train/entry.py): a named
    dataset_test_split, or a mixture's test_split_size."""
    mixture = values.get("dataset_mixture")
    size = mixture.get("test_split_size") if isinstance(mixture, dict) else None
    size = getattr(mixture, "test_split_size", size)
    return values.get("dataset_test_split") is not None or bool(size)


def _evaluating(values: dict[str, Any]) -> bool:
    """TRL's evaluation runs: asked for (eval_strategy) and with data to evaluate."""
    return _evaluation_asked(values) and _has_test_split(values)


_BATCH_KEYS = (
    "per_device_train_batch_size",
    "generation_batch_size",
    "steps_per_generation",
    "gradient_accumulation_steps",
    "num_generations",
)
_EVAL_BATCH_KEYS = ("per_device_eval_batch_size", "num_generations", "num_generations_eval")


def batch_for_processes(
    values: dict[str, Any], world_size: int
) -> tuple[dict[str, Any], int | None]:
    """TRL's generation batch derivation, for `world_size` processes instead of its own.

    TRL's GRPOConfig derives generation_batch_size / steps_per_generation from the world size
    of the process that builds it (1 in the launcher). We derive both for the explicit number
    of processes, check them (and the evaluation batch), and hand TRL the generation batch only
    (it refuses both): the values to build the config with, and the steps_per_generation to set
    afterwards. Rules whose keys already have a problem are skipped.
    """
    if "num_generations" not in values:  # SFT (recipe/sft_keys.py): no generation batch
        return values, None
    batch = values["per_device_train_batch_size"]
    size, steps = values.get("generation_batch_size"), values.get("steps_per_generation")
    if size is not None and steps is not None:
        return values, steps  # TRL's own error says they cannot both be set
    hint = server_mode_hint(values)
    with collecting("the recipe") as problems:
        # Keys with a problem already (their default stands in): their rules are skipped.
        if problems.failed(*_BATCH_KEYS):
            # A bad batch key (e.g. 0): nothing to derive; TRL derives from its default.
            return values, max(steps or 1, 1)
        skip_batch = False
        if size is not None and size % (batch * world_size):
            problems.add(
                f"generation_batch_size ({size}) is not a multiple of per_device_train_batch_size "
                f"({batch}) x processes ({world_size}); set it to a multiple of "
                f"{batch * world_size} or set steps_per_generation instead{hint}"
            )
            skip_batch = True
        steps = (size // (batch * world_size) if size is not None else steps) or values[
            "gradient_accumulation_steps"
        ]
        if not skip_batch:
            with problems.check():
                check_batch_arithmetic(batch, world_size, steps, values["num_generations"], hint)
        if _evaluation_asked(values) and not _has_test_split(values):
            problems.add(
                f"eval_strategy: {values['eval_strategy']}: the trainer evaluates the data's "
                "test split and this recipe has none; set dataset_test_split (a hub dataset's "
                "split) or a dataset_mixture test_split_size, or eval_strategy: 'no' (benchmarks "
                "score checkpoints without it)"
            )
        if _evaluating(values) and not problems.failed(*_EVAL_BATCH_KEYS):
            group = values.get("num_generations_eval") or values["num_generations"]
            with problems.check():
                check_eval_batch(values["per_device_eval_batch_size"], world_size, group, hint)
    steps = max(steps, 1)
    derived = {"generation_batch_size": batch * world_size * steps, "steps_per_generation": None}
    return {**values, **derived}, steps


def check_dataset_source(name: str | None, mixture: Any) -> None:
    """Exactly one of dataset_name / dataset_mixture (the data loader's rule too: it calls
    this); on the values alone, so the launcher says it before any trainer starts."""
    if (name is None) == (mixture is None):
        state = "both are set" if name is not None else "neither is set"
        raise ConfigError(
            f"dataset_name / dataset_mixture: exactly one is required ({state}); "
            "set dataset_name (hub id, builtin:NAME or local path) or dataset_mixture"
        )


def _looks_local(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", ".cache")) or os.path.exists(name)


def check_model_path(model_name_or_path: str | None, key: str = "model_name_or_path") -> None:
    """A model the run loads (`key`: the recipe key naming it) is a hub id or a model
    directory."""
    if not model_name_or_path:
        raise ConfigError(f"{key}: not set; give a local model directory or a hub id")
    if _looks_local(model_name_or_path):
        path = Path(model_name_or_path).expanduser()
        if (path / "config.json").is_file():
            return
        if (path / "adapter_config.json").is_file():
            # A LoRA run's output: the vLLM server cannot load it and our LoRA path expects a
            # full base model, so it is refused here rather than at model load on the GPUs.
            raise ConfigError(
                f"{key}: {model_name_or_path!r} is a PEFT adapter "
                "(adapter_config.json), not a full model; merge it into its base model "
                "(peft: AutoPeftModelForCausalLM.from_pretrained(dir).merge_and_unload()"
                ".save_pretrained(out)) and give that directory"
            )
        raise ConfigError(
            f"{key}: {model_name_or_path!r} is not a model directory "
            "(no config.json); fix the path or use a hub id"
        )


REFERENCE = "reference_model_name_or_path"


def check_same_vocabulary(policy: str, policy_revision, reference: str, reference_revision) -> None:
    """The reference's tokenizer has the policy's vocabulary: the KL compares the two models'
    log-probabilities of the same token ids. Loads both tokenizers (transformers)."""
    from transformers import AutoTokenizer  # deferred: transformers is slow to import

    vocabs = [
        AutoTokenizer.from_pretrained(name, revision=revision).get_vocab()
        for name, revision in ((policy, policy_revision), (reference, reference_revision))
    ]
    if vocabs[0] == vocabs[1]:
        return
    differ = sorted(set(vocabs[0].items()) ^ set(vocabs[1].items()))
    raise ConfigError(
        f"{REFERENCE}: {reference!r} has another tokenizer vocabulary than model_name_or_path "
        f"{policy!r} ({len(vocabs[1])} vs {len(vocabs[0])} tokens, e.g. {differ[0][0]!r}); the "
        "KL compares log-probabilities token by token, so use a reference with the policy's "
        "tokenizer"
    )


def check_reference_model(training, model) -> None:
    """reference_model_name_or_path: a model to load, not with PEFT (TRL's reference is then
    the base model with the adapter off), with the policy's vocabulary when both are local
    (a hub reference is compared in the trainer, train/reference_model.py)."""
    reference = training.reference_model_name_or_path
    if reference is None:
        return
    check_model_path(reference, REFERENCE)
    if model is None:
        return
    if model.use_peft:
        raise ConfigError(
            f"{REFERENCE}: set with use_peft: a PEFT run's KL reference is the base model with "
            f"the adapter off; unset {REFERENCE} or use_peft"
        )
    policy = model.model_name_or_path
    if policy and _looks_local(policy) and _looks_local(reference):
        check_same_vocabulary(
            policy, model.model_revision, reference, training.reference_model_revision
        )


# The writability probe's name: made and removed at once (a test harness watching a tree may
# see one in passing).
WRITE_PROBE_PREFIX = ".write-test-"


def check_output_dir(output_dir: str | None) -> None:
    """The output directory must be writable (or creatable) before any training starts.

    Leaves nothing behind: `check` and `plan` create no directories. Where the directory does
    not exist yet, a directory is made and removed in its nearest existing parent (a
    permission bit does not tell: root may write anywhere, but not in /proc).
    """
    if not output_dir:
        raise ConfigError("output_dir: not set; give a writable directory")
    path = Path(output_dir).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    problem = None
    if not existing.is_dir():
        problem = f"{existing} is a file"
    elif existing == path:
        try:
            with tempfile.NamedTemporaryFile(dir=path, prefix=WRITE_PROBE_PREFIX):
                pass
        except OSError as exc:
            problem = exc.strerror
    else:
        try:
            tempfile.TemporaryDirectory(dir=existing, prefix=WRITE_PROBE_PREFIX).cleanup()
        except OSError:
            problem = f"cannot create it in {existing}"
    if problem:
        raise ConfigError(
            f"output_dir: {output_dir!r} is not writable ({problem}); choose another directory"
        )


def check_launch(launch_args) -> None:
    """Launcher keys that name files must name existing ones."""
    config = launch_args.accelerate_config
    if config and not Path(config).is_file():
        raise ConfigError(
            f"accelerate_config: {config!r} does not exist; use one of "
            "recipes/accelerate_configs/{ddp,zero2,zero3}.yaml or your own file"
        )


def check_keys(keys: RecipeKeys, world_size: int) -> None:
    """The launcher's checks: what the values alone decide, without TRL, torch or datasets.

    Batch arithmetic for `world_size` processes, the data source, model paths, output_dir and
    accelerate_config (ranges and choices were checked when the keys were read). Rewards, data
    columns, benchmarks and TRL's own `__post_init__` checks run in the trainers before a model
    is loaded, and in `maxent-grpo check` (check_recipe on the built recipe).
    """
    with collecting(keys.path) as problems:
        batch_for_processes(dict(keys.values), world_size)
        with problems.check("dataset_name", "dataset_mixture"):
            values = keys.values
            check_dataset_source(values.get("dataset_name"), values.get("dataset_mixture"))
        with problems.check("model_name_or_path"):
            check_model_path(keys.model_name_or_path)
        if keys.values.get(REFERENCE) is not None:  # GRPO's key (SFT has no reference)
            with problems.check(REFERENCE):
                check_model_path(keys.reference_model_name_or_path, REFERENCE)
        with problems.check("accelerate_config"):
            check_launch(keys.launch)
        with problems.check("output_dir"):
            check_output_dir(keys.output_dir)
        _check_rules_on_keys(keys, world_size, problems)


# What a rule raises on a value that has a problem already (a 0 it divides by).
_BAD_VALUE_ERRORS = (ArithmeticError, TypeError, KeyError, AttributeError)


def _check_rules_on_keys(keys: RecipeKeys, world_size: int, problems: Problems) -> None:
    """recipe/rules.py on the keys, as each trainer runs it on its section: a line naming a key
    with a problem already is that problem again (its value stands in), and is left out."""
    try:
        check_rules(keys, world_size, keys.method, model=keys)
        return
    except ConfigError as exc:
        lines = exc.problems if isinstance(exc, ConfigProblems) else (str(exc),)
    except _BAD_VALUE_ERRORS:
        if problems.bad_keys:
            return  # a bad value's own problem says it
        raise
    for line in lines:
        if not any(re.search(rf"\b{re.escape(k)}\b", line) for k in problems.bad_keys):
            problems.add(line)
