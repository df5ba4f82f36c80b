"""A prime-rl RL config (TOML) written as a recipe that means the same, where its environment
has a counterpart here. Pure.

Units: orchestrator.batch_size counts rollouts (completions) per optimizer step, one step per
batch; group_size (default 1) completions per example; deployment.num_train_gpus train and
num_infer_gpus serve vLLM (a server of its own: vllm_mode: server). prime-rl trains up to
max_off_policy_steps (default 8) steps behind the policy; here generation is on-policy.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from maxent_grpo.errors import ConfigError
from maxent_grpo.migrate.refit import refit_train
from maxent_grpo.migrate.verl_script import flatten
from maxent_grpo.migrate.whole import NewRecipe

ORIGIN = "prime-rl"
TASK = "orchestrator.train.source.env.taskset."
#: The prime-rl environments (verifiers tasksets) that have a counterpart here, with its
#: reward and columns.
ENVIRONMENTS = {
    "math-env": {
        "reward_funcs": ["boxed_accuracy_math"],
        "dataset_prompt_column": "question",
        "dataset_answer_column": "answer",
    },
}


def _read(text: str, source: str) -> dict[str, Any]:
    try:
        import tomllib  # Python 3.11+: prime-rl's configs are TOML
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        raise ConfigError(f"{source}: reading TOML needs Python 3.11 (tomllib)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML ({exc})") from None
    sources = data.get("orchestrator", {}).get("train", {}).pop("source", [])
    flat = flatten(data)
    if len(sources) != 1:
        raise ConfigError(
            f"{source}: {len(sources)} orchestrator.train.source entries; one migrates"
        )
    flat.update(flatten(sources[0], "orchestrator.train.source."))
    return flat


def _environment(out: NewRecipe, keys: dict[str, Any]) -> None:
    env = keys.get(TASK + "id")
    if env not in ENVIRONMENTS:
        raise ConfigError(
            f"{out.source}: {TASK}id: {env}: this prime-rl environment has no counterpart here "
            f"(environments with one: {', '.join(ENVIRONMENTS)}); write its dataset and reward "
            "as a recipe (docs/recipes.md, docs/rewards.md)"
        )
    out.set(
        "dataset_name", keys[TASK + "dataset_name"], f"the dataset of {env}", TASK + "dataset_name"
    )
    if TASK + "dataset_subset" in keys:
        out.set(
            "dataset_config", keys[TASK + "dataset_subset"], "its subset", TASK + "dataset_subset"
        )
    for key, value in ENVIRONMENTS[env].items():
        out.set(key, value, f"{env} (verifiers) scores the \\boxed{{}} answer", TASK + "id")


def _batch(out: NewRecipe, keys: dict[str, Any], processes: int) -> list[str]:
    group = keys.get("orchestrator.group_size", 1)
    if group < 2:
        raise ConfigError(
            f"{out.source}: orchestrator.group_size: {group} (prime-rl's default is 1): GRPO's "
            "advantages need at least 2 completions per example (with 1 every advantage is 0); "
            "set orchestrator.group_size >= 2"
        )
    batch = keys.get("orchestrator.batch_size")
    if not isinstance(batch, int):
        raise ConfigError(
            f"{out.source}: orchestrator.batch_size is not set (token_batch_size does not migrate)"
        )
    fit = refit_train(batch, batch, group, processes, cap=8)
    out.set("num_generations", group, "completions per example", "orchestrator.group_size")
    why = f"prime-rl: {batch} rollouts per step, one step per batch"
    out.set("per_device_train_batch_size", fit.per_device, why, "orchestrator.batch_size")
    out.set(
        "gradient_accumulation_steps", fit.accumulation, fit.lines[0], "orchestrator.batch_size"
    )
    out.set(
        "steps_per_generation",
        fit.steps_per_generation,
        fit.lines[1],
        "orchestrator.batch_size",
        differs=not fit.exact,
    )
    return [why, *fit.lines]


def _training(out: NewRecipe, keys: dict[str, Any]) -> None:
    sampling = "orchestrator.train.sampling."
    out.set(
        "temperature", keys.get(sampling + "temperature", 1.0), "sampling", sampling + "temperature"
    )
    if sampling + "max_completion_tokens" in keys:
        out.set(
            "max_completion_length",
            keys[sampling + "max_completion_tokens"],
            "tokens",
            sampling + "max_completion_tokens",
        )
    length = keys.get("seq_len", keys.get("orchestrator.seq_len"))
    if length:
        out.set(
            "vllm_max_model_length",
            length,
            "prompt + completion",
            "seq_len",
            "orchestrator.seq_len",
        )
    optim = "trainer.optim."
    out.set("learning_rate", keys.get(optim + "lr", 1e-6), "the trainer's", optim + "lr")
    out.set(
        "weight_decay", keys.get(optim + "weight_decay", 0.01), "AdamW's", optim + "weight_decay"
    )
    out.set("max_grad_norm", keys.get(optim + "max_norm", 1.0), "clipping", optim + "max_norm")
    if "max_steps" in keys:
        out.set("max_steps", keys["max_steps"], "optimizer steps", "max_steps")
    out.set("beta", 0.0, "prime-rl's GRPO has no KL loss")
    out.leave_out(
        "orchestrator.max_off_policy_steps",
        keys.get("orchestrator.max_off_policy_steps", 8),
        "prime-rl trains on rollouts up to this many steps old; here every step trains on "
        "rollouts of the current policy (async_generation: one step old, docs/async.md)",
        differs=True,
    )


def prime_rl_recipe(
    text: str, source: str, gpus: int | None, nodes: int
) -> tuple[NewRecipe, list[str], tuple[int, int]]:
    """The recipe, the batch arithmetic and the allocation (GPUs per node, nodes) to check."""
    keys = _read(text, source)
    out = NewRecipe(ORIGIN, source)
    out.set("method", "grpo", "prime-rl's RL loss is group-relative")
    out.set("model_name_or_path", keys.get("model.name"), "the policy", "model.name")
    _environment(out, keys)
    train = keys.get("deployment.num_train_gpus", 1)
    infer = keys.get("deployment.num_infer_gpus", 1)
    gpus = gpus or train + infer
    processes = max(gpus * nodes - infer, 1)
    arithmetic = _batch(out, keys, processes)
    _training(out, keys)
    out.set("use_vllm", True, f"{infer} GPU(s) serve vLLM", "deployment.num_infer_gpus")
    out.set("vllm_mode", "server", "a vLLM server of its own, as prime-rl's inference")
    if infer > 1:
        out.set("vllm_data_parallel_size", infer, "one engine per GPU", "deployment.num_infer_gpus")
    out.used.add("deployment.num_train_gpus")
    name = keys.get("monitors.wandb.name") or PurePath(source).stem
    out.set("output_dir", f"outputs/{name}", "a folder per run", "monitors.wandb.name")
    if "monitors.wandb.project" in keys:
        out.set("report_to", ["wandb"], "W&B", "monitors.wandb.project")
        out.set(
            "wandb_project", keys["monitors.wandb.project"], "its project", "monitors.wandb.project"
        )
    for key in sorted(set(keys) - out.used):
        out.leave_out(key, keys[key], "a prime-rl setting with no counterpart here", differs=False)
    lines = [f"{processes} training processes, {infer} vLLM GPU(s)"]
    return out, [*lines, *arithmetic], (gpus, nodes)
