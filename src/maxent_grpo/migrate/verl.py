"""verl's GRPO run (a `verl.trainer.main_ppo` script or config, as dotted keys: verl_script.py)
written as a recipe that means the same. Pure: the data sources of the parquet files and the
planned GPUs are arguments (the CLI reads and plans them).

Meaning kept: model, data, group size, learning rate and schedule, lengths, sampling, KL,
entropy, clipping, loss aggregation, std normalisation, LoRA, and the global batch (verl
counts prompts, TRL completions: refit.py). verl generates on the GPUs that train, so the
recipe colocates vLLM (vllm_mode: colocate) with the same tensor parallel size and memory.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from maxent_grpo.errors import ConfigError
from maxent_grpo.migrate.refit import refit_train
from maxent_grpo.migrate.verl_keys import ACTOR, DEFAULTS, MODEL, ROLLOUT, fate
from maxent_grpo.migrate.whole import NewRecipe

ORIGIN = "verl"
#: The built-in reward for each of verl's data_source values (its default reward, in
#: verl/utils/reward_score), and whether the built-in scores differently.
REWARDS = {
    "openai/gsm8k": ("gsm8k_answer", False, "the last '#### N' equal to the reference"),
    "lighteval/MATH": ("boxed_accuracy_math", True, "_math"),
    "DigitalLearningGmbH/MATH-lighteval": ("boxed_accuracy_math", True, "_math"),
    "HuggingFaceH4/MATH-500": ("boxed_accuracy_math", True, "_math"),
}
_MATH_WHY = (
    "the last \\boxed{} answer; graded for mathematical equivalence (math-verify) where verl "
    "compares normalised strings"
)
#: verl's loss_agg_mode -> TRL's loss_type of the same normalisation.
LOSS_TYPES = {
    "token-mean": ("dapo", "mean over every token of the batch"),
    "seq-mean-token-mean": ("grpo", "mean over each sequence's tokens, then over sequences"),
    "seq-mean-token-sum-norm": ("dr_grpo", "token sums divided by the completion length bound"),
}
_SCHEDULES = {"constant": "constant", "cosine": "cosine"}


class Verl:
    """The keys of one run, read with verl's defaults."""

    def __init__(self, keys: dict[str, Any]) -> None:
        self.keys = keys

    def __call__(self, key: str) -> Any:
        return self.keys.get(key, DEFAULTS.get(key))


def _method(out: NewRecipe, k: Verl) -> None:
    estimator = k("algorithm.adv_estimator")
    if estimator != "grpo":
        raise ConfigError(
            f"{out.source}: algorithm.adv_estimator: {estimator}: this toolkit trains GRPO "
            "(and MaxEnt-GRPO); only a verl GRPO run (algorithm.adv_estimator=grpo) migrates"
        )
    out.set("method", "grpo", "group-relative advantages", "algorithm.adv_estimator")
    out.set("model_name_or_path", k(MODEL + "path"), "the policy and reference", MODEL + "path")
    out.set("bf16", True, "verl trains and generates in bfloat16")


def _files(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _rewards(out: NewRecipe, sources: dict[str, list[str]]) -> None:
    found = sorted({s for names in sources.values() for s in names})
    names, whys = [], []
    for source in found:
        if source not in REWARDS:
            out.missing(
                "reward_funcs",
                f"data_source {source}: verl scores it with its own rule and no built-in "
                "here scores the same; add reward_funcs: [module:function] (docs/rewards.md)",
            )
            continue
        name, differs, why = REWARDS[source]
        if name not in names:
            names.append(name)
            whys.append(f"{source}: {_MATH_WHY if why == '_math' else why}")
        out.used.add("data.reward_fn_key")
    if names:
        several = "; each reward scores every row (verl: the row's own)" if len(names) > 1 else ""
        out.set("reward_funcs", names, "; ".join(whys) + several, differs=len(names) > 1)


def _data(out: NewRecipe, k: Verl, sources: dict[str, list[str]]) -> None:
    files = _files(k("data.train_files"))
    if len(files) == 1:
        out.set("dataset_name", files[0], "verl's parquet file", "data.train_files")
    else:
        mixture = {"datasets": [{"path": f} for f in files]}
        out.set("dataset_mixture", mixture, "verl's parquet files, all rows", "data.train_files")
    out.set("dataset_prompt_column", k("data.prompt_key"), "chat messages", "data.prompt_key")
    out.set(
        "dataset_answer_column",
        "reward_model.ground_truth",
        "verl's layout: the reference answer in the reward_model struct",
    )
    _rewards(out, sources)
    if k("data.shuffle") is False:
        out.set("shuffle_dataset", False, "the data in file order", "data.shuffle")


def _per_device_cap(k: Verl) -> int:
    """The largest per-device batch: verl's micro batch (completions per GPU per forward), or
    its token budget over the longest sequence with dynamic batch size."""
    if k(ACTOR + "use_dynamic_bsz"):
        longest = k("data.max_prompt_length") + k("data.max_response_length")
        return max(1, k(ACTOR + "ppo_max_token_len_per_gpu") // longest)
    return k(ACTOR + "ppo_micro_batch_size_per_gpu") or 1


def _batch(out: NewRecipe, k: Verl, processes: int) -> list[str]:
    group = k(ROLLOUT + "n")
    prompts, mini = k("data.train_batch_size"), k(ACTOR + "ppo_mini_batch_size")
    out.set("num_generations", group, "completions per prompt", ROLLOUT + "n")
    if group < 2:
        raise ConfigError(
            f"{out.source}: actor_rollout_ref.rollout.n: {group}: GRPO's advantages need at "
            "least 2 completions per prompt (with 1 every advantage is 0); set rollout.n >= 2"
        )
    per_generation, per_step = prompts * group, mini * group
    fit = refit_train(per_step, per_generation, group, processes, _per_device_cap(k))
    used = ("data.train_batch_size", ACTOR + "ppo_mini_batch_size")
    why = f"verl: {prompts} prompts x {group} per generation, {mini} x {group} per step"
    out.set("per_device_train_batch_size", fit.per_device, why, *used)
    out.set("gradient_accumulation_steps", fit.accumulation, fit.lines[0], *used)
    out.set(
        "steps_per_generation", fit.steps_per_generation, fit.lines[1], *used, differs=not fit.exact
    )
    epochs = k(ACTOR + "ppo_epochs")
    out.set("num_iterations", epochs, "passes over each generation batch", ACTOR + "ppo_epochs")
    return [why, *fit.lines]


def _optimizer(out: NewRecipe, k: Verl) -> None:
    o = ACTOR + "optim."
    out.set("learning_rate", k(o + "lr"), "the actor's", o + "lr")
    steps, ratio = k(o + "lr_warmup_steps"), k(o + "lr_warmup_steps_ratio")
    warmup = steps if isinstance(steps, int) and steps > 0 else ratio
    out.set(
        "warmup_steps",
        warmup,
        "a float below 1 is a fraction",
        o + "lr_warmup_steps_ratio",
        o + "lr_warmup_steps",
    )
    style = k(o + "warmup_style") or k(o + "lr_scheduler_type")
    if style not in _SCHEDULES:
        raise ConfigError(
            f"{out.source}: {o}lr_scheduler_type: {style}: no counterpart here; "
            "use constant or cosine"
        )
    schedule = _SCHEDULES[style] + ("_with_warmup" if style == "constant" and warmup else "")
    min_ratio = k(o + "min_lr_ratio")
    if style == "cosine" and min_ratio:
        schedule = "cosine_with_min_lr"
        out.set("lr_scheduler_kwargs", {"min_lr_rate": min_ratio}, "the floor", o + "min_lr_ratio")
    out.set(
        "lr_scheduler_type",
        schedule,
        "verl's schedule",
        o + "lr_scheduler_type",
        o + "warmup_style",
    )
    out.set("weight_decay", k(o + "weight_decay"), "AdamW's", o + "weight_decay")
    clip = k(o + "clip_grad") if o + "clip_grad" in k.keys else k(ACTOR + "grad_clip")
    out.set(
        "max_grad_norm",
        clip if clip is not None else 1.0,
        "gradient clipping",
        o + "clip_grad",
        ACTOR + "grad_clip",
    )
    out.used.update({o + "min_lr_ratio", o + "num_cycles", o + "total_training_steps"})


def _lengths_and_sampling(out: NewRecipe, k: Verl) -> None:
    prompt, response = k("data.max_prompt_length"), k("data.max_response_length")
    out.set("max_completion_length", response, "tokens per completion", "data.max_response_length")
    out.set(
        "vllm_max_model_length",
        prompt + response,
        "prompt + completion, as verl's engine",
        "data.max_prompt_length",
    )
    out.set("temperature", k(ROLLOUT + "temperature"), "sampling", ROLLOUT + "temperature")
    out.set("top_p", k(ROLLOUT + "top_p"), "sampling", ROLLOUT + "top_p")
    top_k = k(ROLLOUT + "top_k")
    why = "-1 (vLLM's 'off') is 0 in TRL 1.16" if top_k == -1 else "sampling"
    out.set("top_k", 0 if top_k in (-1, None) else top_k, why, ROLLOUT + "top_k")


def _kl(out: NewRecipe, k: Verl) -> None:
    loss, kind = k(ACTOR + "use_kl_loss"), k(ACTOR + "kl_loss_type")
    used = (ACTOR + "use_kl_loss", ACTOR + "kl_loss_coef", ACTOR + "kl_loss_type")
    if not loss:
        out.set("beta", 0.0, "no KL loss (use_kl_loss: false)", *used)
    elif kind in ("low_var_kl", "k3"):
        out.set("beta", k(ACTOR + "kl_loss_coef"), f"KL loss weight; {kind} is TRL's k3", *used)
    else:
        why = f"TRL's KL loss is the k3 estimator; verl's {kind} estimates it otherwise"
        out.set("beta", k(ACTOR + "kl_loss_coef"), why, *used, differs=True)
    if k("algorithm.use_kl_in_reward"):
        out.leave_out(
            "algorithm.use_kl_in_reward",
            True,
            "a KL penalty in the reward has no counterpart in GRPO here; the KL loss (beta) "
            "is the regulariser",
            differs=True,
        )
    else:
        out.used.add("algorithm.use_kl_in_reward")
    out.used.update(
        key for key in k.keys if key.startswith(("algorithm.kl_ctrl.", "algorithm.kl_penalty"))
    )


def _loss(out: NewRecipe, k: Verl) -> None:
    low = k(ACTOR + "clip_ratio_low") or k(ACTOR + "clip_ratio")
    high = k(ACTOR + "clip_ratio_high") or k(ACTOR + "clip_ratio")
    clip = (ACTOR + "clip_ratio", ACTOR + "clip_ratio_low")
    out.set("epsilon", low, "lower clip of the ratio", *clip)
    out.set("epsilon_high", high, "upper clip", ACTOR + "clip_ratio_high")
    out.set(
        "delta",
        k(ACTOR + "clip_ratio_c"),
        "dual clip: ratio bound for negative advantages",
        ACTOR + "clip_ratio_c",
    )
    mode = k(ACTOR + "loss_agg_mode")
    if mode not in LOSS_TYPES:
        raise ConfigError(
            f"{out.source}: {ACTOR}loss_agg_mode: {mode}: no counterpart here; use one of "
            + ", ".join(LOSS_TYPES)
        )
    out.set("loss_type", LOSS_TYPES[mode][0], LOSS_TYPES[mode][1], ACTOR + "loss_agg_mode")
    std = k("algorithm.norm_adv_by_std_in_grpo")
    out.set(
        "scale_rewards",
        "group" if std else "none",
        "advantages over the group's std" if std else "no std",
        "algorithm.norm_adv_by_std_in_grpo",
    )
    out.set(
        "entropy_coef", k(ACTOR + "entropy_coeff"), "entropy bonus weight", ACTOR + "entropy_coeff"
    )


def _model_and_rollout(out: NewRecipe, k: Verl) -> None:
    out.set(
        "gradient_checkpointing",
        bool(k(MODEL + "enable_gradient_checkpointing")),
        "memory",
        MODEL + "enable_gradient_checkpointing",
    )
    if k(MODEL + "lora_rank"):
        lora = (MODEL + "lora_rank", MODEL + "lora_alpha", MODEL + "target_modules")
        out.set("use_peft", True, "LoRA", *lora)
        out.set("lora_r", k(MODEL + "lora_rank"), "rank", MODEL + "lora_rank")
        out.set("lora_alpha", k(MODEL + "lora_alpha"), "scale", MODEL + "lora_alpha")
        out.set(
            "lora_target_modules", k(MODEL + "target_modules"), "layers", MODEL + "target_modules"
        )
    else:
        out.used.update({MODEL + "lora_rank", MODEL + "lora_alpha", MODEL + "target_modules"})
    engine = k(ROLLOUT + "name")
    why = "verl generates on the GPUs that train" + (
        "" if engine == "vllm" else f" ({engine} there: vLLM here)"
    )
    out.set("use_vllm", True, why, ROLLOUT + "name")
    out.set("vllm_mode", "colocate", "the same GPUs train and generate, as verl's hybrid engine")
    tp = ROLLOUT + "tensor_model_parallel_size"
    out.set("vllm_tensor_parallel_size", k(tp), "GPUs per vLLM engine", tp)
    memory = ROLLOUT + "gpu_memory_utilization"
    out.set("vllm_gpu_memory_utilization", k(memory), "vLLM's share of each GPU", memory)


def _trainer(out: NewRecipe, k: Verl) -> None:
    t = "trainer."
    if t + "total_training_steps" in k.keys and k(t + "total_training_steps"):
        out.set(
            "max_steps",
            k(t + "total_training_steps"),
            "optimizer steps",
            t + "total_training_steps",
        )
    out.set("num_train_epochs", k(t + "total_epochs"), "passes over the data", t + "total_epochs")
    save = k(t + "save_freq")
    if isinstance(save, int) and save > 0:
        out.set("save_strategy", "steps", "checkpoints", t + "save_freq")
        out.set("save_steps", save, "every save_freq steps", t + "save_freq")
    else:
        out.used.add(t + "save_freq")
    project, run = k(t + "project_name"), k(t + "experiment_name")
    where = k(t + "default_local_dir") or f"checkpoints/{project}/{run}"
    out.set(
        "output_dir",
        where,
        "verl's checkpoint folder",
        t + "default_local_dir",
        t + "experiment_name",
    )
    logger = k(t + "logger") or []
    if "wandb" in (logger if isinstance(logger, list) else [logger]):
        out.set("report_to", ["wandb"], "W&B", t + "logger")
        out.set("wandb_project", project, "its project", t + "project_name")
        out.set("run_name", run, "its run", t + "experiment_name")
    else:
        out.set("report_to", "none", "console only", t + "logger", t + "project_name")
    out.used.update({t + "n_gpus_per_node", t + "nnodes", "data.reward_fn_key"})


def _left_out(out: NewRecipe, k: Verl) -> None:
    for key in sorted(set(k.keys) - out.used):
        found = fate(key)
        why, differs = found or (
            "a verl key this toolkit has no counterpart for; check what it did in verl's "
            "ppo_trainer.yaml",
            True,
        )
        out.leave_out(key, k.keys[key], why, differs)


def verl_recipe(
    keys: dict[str, Any], source: str, processes: int, sources: dict[str, list[str]]
) -> tuple[NewRecipe, list[str]]:
    """The recipe of a verl run for `processes` training processes (all planned GPUs: vLLM is
    colocated), and the batch arithmetic, one line each. sources: data_source values by
    training file (verl's data_source column)."""
    k = Verl(keys)
    out = NewRecipe(ORIGIN, source)
    _method(out, k)
    _data(out, k, sources)
    arithmetic = _batch(out, k, processes)
    _optimizer(out, k)
    _lengths_and_sampling(out, k)
    _kl(out, k)
    _loss(out, k)
    _model_and_rollout(out, k)
    _trainer(out, k)
    _left_out(out, k)
    return out, arithmetic


def guess_sources(files: list[str]) -> dict[str, list[str]]:
    """data_source values guessed from the files' folders (gsm8k/, math/), for files that are
    not on this machine."""
    guesses = {"gsm8k": "openai/gsm8k", "math": "DigitalLearningGmbH/MATH-lighteval"}
    found = {}
    for f in files:
        parts = [p.lower() for p in PurePath(f).parts]
        found[f] = [guesses[p] for p in parts if p in guesses][-1:]
    return found


def train_files(keys: dict[str, Any]) -> list[str]:
    return _files(Verl(keys)("data.train_files"))
