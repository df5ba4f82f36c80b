"""Every rule across keys of a recipe: one module, one verdict.

    check_rules(values, world_size, method, model)

`values` is anything that reads a key as an attribute: the launcher's RecipeKeys (every key,
before a process starts: `run`, `plan`, `sbatch`, `check` of a recipe with problems; called by
recipe/checks.py check_keys), or the section being built (GRPOConfig.__post_init__ and SFT's:
`check` and each trainer process at its start, through build_recipe). `model` holds
ModelConfig's keys (the RecipeKeys again, or the built ModelConfig in preflight.check_recipe);
None skips the rules that need them. A value's own range is declared on its field
(recipe/declare.py) and checked when the recipe is read, not here (maxent_tau > 0 included);
the installed packages (launch/requirements.py) and the GPU layout (launch/plan/checks.py) are
checked where they are known. The batch arithmetic, which derives the generation batch for a
number of processes, is recipe/checks.py batch_for_processes.

No TRL import: the launcher reads the defaults it needs from the committed schema.
"""

from __future__ import annotations

import math
from typing import Any

from maxent_grpo.errors import ConfigError, ConfigProblems
from maxent_grpo.methods import async_depth, rollouts_on, uses_vllm_server
from maxent_grpo.recipe import schema
from maxent_grpo.recipe.problems import run_checks
from maxent_grpo.rollout_filters import find_filter
from maxent_grpo.rollout_func import find_rollout_func


def kl_coefficient(values: Any, method: str) -> float:
    """The initial KL coefficient the run uses: MaxEnt-GRPO's init_kl_coeff, GRPO's
    init_kl_coeff when set, else TRL's beta."""
    if method == "maxent" or values.init_kl_coeff > 0:
        return values.init_kl_coeff
    return values.beta


def generation_steps(values: Any, world_size: int | None) -> int:
    """Optimizer micro-steps per generation: steps_per_generation, else the generation batch
    over per_device_train_batch_size x processes (build_recipe derives it so; world_size None,
    a section built directly: not known), else gradient_accumulation_steps (TRL's default)."""
    if values.steps_per_generation:
        return values.steps_per_generation
    if values.generation_batch_size and world_size is not None:
        per_micro_step = values.per_device_train_batch_size * (world_size or 1)
        return max(values.generation_batch_size // per_micro_step, 1)
    return values.gradient_accumulation_steps


def check_rules(values: Any, world_size: int | None, method: str, model: Any = None) -> None:
    """Every rule across keys (MaxEnt's first for method maxent), their problems together
    (ConfigProblems; one ConfigError for one). world_size: the training processes (None: not
    planned, a section built directly: the rules of the process count are skipped)."""
    if method == "sft":
        run_checks(lambda: check_sft_answer(values))
        return
    maxent = method == "maxent"
    checks = [
        *(_maxent_checks(values) if maxent else [lambda: check_kl_coefficient(values)]),
        lambda: check_adaptive_kl(values, method),
        lambda: check_entropy_kl(values, method),
        lambda: check_sync_interval(values),
        lambda: check_async_generation(values, world_size),
        lambda: check_rollouts(values, world_size),
        lambda: check_rollout_func(values),
        lambda: check_kl_horizon(values, world_size),
        lambda: check_server_wait(values),
        lambda: check_replay(values, world_size),
        lambda: check_trainer_values(values, method),
    ]
    if model is not None:
        checks.append(lambda: check_model_rules(values, model))
    run_checks(*checks)


def check_sft_answer(values: Any) -> None:
    """SFT trains on an answer per prompt."""
    if values.dataset_answer_column is None:
        raise ConfigError(
            "dataset_answer_column: null: an SFT run trains on each row's answer as the reply "
            "to its prompt; name the column that holds it (e.g. solution)"
        )


def check_kl_coefficient(values: Any) -> None:
    """GRPO: init_kl_coeff is TRL's beta (the section sets beta from it)."""
    if values.init_kl_coeff > 0 and values.beta not in (0.0, values.init_kl_coeff):
        raise ConfigError(
            f"beta: {values.beta} and init_kl_coeff: {values.init_kl_coeff}: both are the "
            "initial KL coefficient of GRPO; keep one of them"
        )


def check_sync_interval(values: Any) -> None:
    """Stale samples need TRL's correction: without it the loss takes them as on-policy."""
    stale = values.vllm_sync_interval_steps > 1 and values.use_vllm
    if stale and not values.vllm_importance_sampling_correction:
        raise ConfigError(
            f"vllm_sync_interval_steps: {values.vllm_sync_interval_steps} with "
            "vllm_importance_sampling_correction: false: between syncs vLLM samples from an "
            "older policy and nothing corrects for it; set "
            "vllm_importance_sampling_correction: true, or vllm_sync_interval_steps: 1"
        )


def check_async_generation(values: Any, world_size: int | None) -> None:
    """One generation per optimizer step, from a server, with TRL's correction."""
    if not values.async_generation:
        if values.partial_rollout_tokens:
            raise ConfigError(
                f"partial_rollout_tokens: {values.partial_rollout_tokens} without "
                "async_generation: only generation ahead is made in chunks; set "
                "async_generation: true, or partial_rollout_tokens: 0"
            )
        return
    lines = []
    if not uses_vllm_server(values):
        lines.append(
            "async_generation: true needs a vLLM server to generate while the trainers "
            "train; set use_vllm: true and vllm_mode: server, or async_generation: false"
        )
    if not values.vllm_importance_sampling_correction:
        lines.append(
            "async_generation: true with vllm_importance_sampling_correction: false: samples "
            "come from the previous policy and nothing would correct for it; set "
            "vllm_importance_sampling_correction: true"
        )
    steps = generation_steps(values, world_size)
    if steps != values.gradient_accumulation_steps or values.num_iterations != 1:
        lines.append(
            f"async_generation: true needs one generation per optimizer step; "
            f"steps_per_generation {steps} (gradient_accumulation_steps "
            f"{values.gradient_accumulation_steps}) and num_iterations {values.num_iterations} "
            "give another; set steps_per_generation to gradient_accumulation_steps and "
            "num_iterations: 1"
        )
    if values.max_staleness < values.vllm_sync_interval_steps:
        lines.append(
            f"max_staleness: {values.max_staleness} is below vllm_sync_interval_steps "
            f"({values.vllm_sync_interval_steps}): every sample would be too old; set "
            f"max_staleness: {values.vllm_sync_interval_steps} or more"
        )
    lines += _async_depth_problems(values)
    if lines:
        raise ConfigProblems("async_generation", lines)


def _async_depth_problems(values: Any) -> list[str]:
    """How far ahead and in what pieces (train/async_generation.py)."""
    lines = []
    depth = async_depth(values)
    if depth > 1 and rollouts_on(values):
        lines.append(
            f"max_staleness: {values.max_staleness} generates {depth} steps ahead, which "
            "rollout filters, rounds and over-sampling cannot (each step's first round is "
            "known only once the step before has filtered); set max_staleness: "
            f"{values.vllm_sync_interval_steps}"
        )
    if values.partial_rollout_tokens >= values.max_completion_length:
        lines.append(
            f"partial_rollout_tokens: {values.partial_rollout_tokens} is not below "
            f"max_completion_length ({values.max_completion_length}): every completion would "
            "be one chunk; set it below, or 0"
        )
    return lines


def check_rollouts(values: Any, world_size: int | None) -> None:
    """Filters resolve; rounds and oversampling need whole groups on each process."""
    lines = []
    for name in values.rollout_filters or []:
        try:
            find_filter(name)
        except ConfigError as exc:
            lines.append(str(exc))
    steps = generation_steps(values, world_size)
    if (
        rollouts_on(values)
        and (values.per_device_train_batch_size * steps) % values.num_generations
    ):
        lines.append(
            f"per_device_train_batch_size x steps_per_generation: "
            f"{values.per_device_train_batch_size} x {steps} is not a multiple of "
            f"num_generations ({values.num_generations}); rollout_filters, "
            "max_generation_rounds and oversample_factor need whole groups on each process"
        )
    if getattr(values, "oversample_keep", "first") == "best" and not rollouts_on(values):
        lines.append(
            "oversample_keep: best with nothing to choose from: a step holds more groups than "
            "it needs only with oversample_factor > 1, rollout_filters or max_generation_rounds "
            "> 1; set oversample_factor (e.g. 2), or oversample_keep: first"
        )
    if lines:
        raise ConfigProblems("rollout_filters", lines)


def check_replay(values: Any, world_size: int | None) -> None:
    """Replay (train/replay.py) swaps whole groups of each process's generation batch for
    buffered ones, inside TRL's one generation per step."""
    share = values.replay_share
    if not share:
        return
    lines = []
    if values.async_generation:
        lines.append(
            f"replay_share: {share} with async_generation: true: the next step's prompts are "
            "sent ahead in full, before replay decides which of them to skip; set one of them"
        )
    if rollouts_on(values):
        lines.append(
            f"replay_share: {share} with rollout_filters, max_generation_rounds or "
            "oversample_factor: replay does not yet work with generation rounds (a round's "
            "groups and their rewards are regrouped there); drop one of them"
        )
    rows = values.per_device_train_batch_size * generation_steps(values, world_size)
    groups = rows // values.num_generations
    replayed = math.floor(share * groups)
    if rows % values.num_generations:
        lines.append(
            f"replay_share: {share}: per_device_train_batch_size x steps_per_generation "
            f"({rows}) is not a multiple of num_generations ({values.num_generations}); replay "
            "swaps whole groups on each process"
        )
    elif groups < 2:
        lines.append(
            f"replay_share: {share} with {groups} group per process per generation: replay "
            "needs at least 2 (one fresh, one replayed); raise per_device_train_batch_size or "
            "steps_per_generation, or lower num_generations"
        )
    elif replayed < 1:
        lines.append(
            f"replay_share: {share} of the {groups} groups each process generates per step "
            f"replays none; set replay_share to at least {math.ceil(100 / groups) / 100:g}"
        )
    elif values.replay_buffer_size < replayed:
        lines.append(
            f"replay_buffer_size: {values.replay_buffer_size} holds fewer groups than the "
            f"{replayed} a step replays; set replay_buffer_size to at least {replayed}"
        )
    if lines:
        raise ConfigProblems("replay_share", lines)


def check_rollout_func(values: Any, script: Any = None) -> None:
    """rollout_func imports, takes (prompts, trainer), and is not used with what would also
    generate: async generation (it makes the next step's completions with TRL's own call),
    tools or an environment (TRL would run its tool loop on the function's completions).
    `script`: the section holding tools and environment (None: `values` holds every key)."""
    name = getattr(values, "rollout_func", None)
    if name is None:
        return
    find_rollout_func(name)
    script = values if script is None else script
    others = [
        key
        for key, on in (
            ("async_generation", values.async_generation),
            ("tools", getattr(script, "tools", None)),
            ("environment", getattr(script, "environment", None)),
        )
        if on
    ]
    if others:
        raise ConfigError(
            f"rollout_func: {name!r} with {' and '.join(others)}: the rollout function "
            f"generates each step on its own; drop {' and '.join(others)} (run tools inside "
            "the function), or drop rollout_func"
        )


def check_adaptive_kl(values: Any, method: str) -> None:
    if (values.kl_target is None) != (values.kl_horizon is None):
        missing = "kl_horizon" if values.kl_horizon is None else "kl_target"
        raise ConfigError(
            f"{missing}: not set; an adaptive beta needs both kl_target and kl_horizon "
            "(e.g. kl_target: 0.05, kl_horizon: 10000), or neither for a fixed beta"
        )
    if values.kl_target is not None and not kl_coefficient(values, method) > 0:
        raise ConfigError(
            f"init_kl_coeff: {values.init_kl_coeff}: an adaptive beta (kl_target) multiplies "
            "beta, so it must start > 0; set init_kl_coeff, e.g. 0.05"
        )


def check_kl_horizon(values: Any, world_size: int | None) -> None:
    """kl_horizon against the completions of one optimizer step over `world_size` processes."""
    if values.kl_horizon is None or world_size is None:
        return
    per_step = values.per_device_train_batch_size * values.gradient_accumulation_steps * world_size
    if values.kl_horizon < per_step:
        raise ConfigError(
            f"kl_horizon: {values.kl_horizon}: below the {per_step} completions of one "
            "optimizer step (per_device_train_batch_size x gradient_accumulation_steps x "
            f"processes), so one update could move beta by over 20%; set kl_horizon >= "
            f"{per_step} (Ziegler et al. use 10000)"
        )


def check_entropy_kl(values: Any, method: str) -> None:
    """The KL-adaptive entropy bonus scales TRL's entropy_coef by the KL to the reference."""
    threshold = values.entropy_kl_threshold
    if threshold is None:
        return
    lines = []
    if values.entropy_coef <= 0:
        lines.append(
            f"entropy_kl_threshold: {threshold} with entropy_coef: "
            f"{values.entropy_coef}: the rule multiplies entropy_coef; set entropy_coef > 0"
        )
    if not kl_coefficient(values, method) > 0:
        lines.append(
            f"entropy_kl_threshold: {threshold} with beta: {values.beta}: the KL is measured "
            "against the reference model, which beta > 0 loads; set beta (e.g. 0.04)"
        )
    if values.use_adaptive_entropy:
        lines.append(
            "entropy_kl_threshold with use_adaptive_entropy: true: two rules for one "
            "entropy_coef; keep one of them"
        )
    if values.entropy_kl_below == "keep" and values.entropy_kl_above == "keep":
        lines.append(
            f"entropy_kl_threshold: {threshold} with entropy_kl_below and "
            "entropy_kl_above both keep: nothing adapts; set entropy_kl_below: raise or "
            "entropy_kl_above: lower (or off), or unset entropy_kl_threshold"
        )
    if lines:
        raise ConfigProblems("entropy_kl_threshold", lines)


def check_server_wait(values: Any) -> None:
    """The trainers connect to the vLLM server at their first generation (train/vllm_connect.py):
    the first rank waits up to vllm_server_timeout, the others in a collective that gives up
    after ddp_timeout, with an error that names neither. The first wait must end first."""
    if not uses_vllm_server(values):
        return
    if values.vllm_server_timeout >= values.ddp_timeout:
        raise ConfigError(
            f"vllm_server_timeout: {values.vllm_server_timeout:g} s is not below ddp_timeout "
            f"({values.ddp_timeout} s), after which the other ranks give up waiting for the "
            "first one's server connection; lower vllm_server_timeout or raise ddp_timeout"
        )


def check_trainer_values(values: Any, method: str) -> None:
    """Combinations TRL's GRPOTrainer.__init__ refuses only after the model is loaded
    (trl/trainer/grpo_trainer.py): refused here, before it is."""
    lines = []
    if values.sync_ref_model and kl_coefficient(values, method) == 0 and method != "maxent":
        lines.append(
            "sync_ref_model: true with beta 0: there is no reference model to synchronise; "
            "set beta (or init_kl_coeff) > 0, or sync_ref_model: false"
        )
    vespo_modes = ("token_truncate", "token_mask")
    if (
        values.loss_type == "vespo"
        and values.use_vllm
        and values.vllm_importance_sampling_correction
        and values.vllm_importance_sampling_mode not in vespo_modes
    ):
        lines.append(
            f"vllm_importance_sampling_mode: {values.vllm_importance_sampling_mode!r}: "
            "loss_type vespo needs token_truncate or token_mask; set one of them"
        )
    if lines:
        raise ConfigProblems("sync_ref_model", lines)


def check_model_rules(values: Any, model: Any) -> None:
    """The training keys against ModelConfig's (PEFT), which the training section lacks."""
    lines = []
    if values.sync_ref_model and model.use_peft:
        lines.append(
            "sync_ref_model: true with use_peft: TRL's PEFT reference is the adapter-free "
            "model, nothing to synchronise; set sync_ref_model: false"
        )
    if model.use_peft and "lm_head" in (model.lora_target_modules or []):
        lines.append(
            "lora_target_modules: 'lm_head': TRL computes log-probabilities from "
            "lm_head.weight directly, so an adapter there is never trained; remove it"
        )
    if lines:
        raise ConfigProblems("use_peft", lines)


# MaxEnt-GRPO ---------------------------------------------------------------------------------

# GRPO keys (TRL's and ours) with no meaning for the MaxEnt loss, and what to use instead.
_UNUSED_TRL_KEYS = {
    "loss_type": "MaxEnt-GRPO has its own loss, the weighted log-likelihood",
    "scale_rewards": "the weights come from softmax(reward / maxent_q_temperature), not "
    "normalised advantages; tune maxent_q_temperature",
    "multi_objective_aggregation": "MaxEnt uses the reward_weights-weighted sum of the rewards",
    "importance_sampling_level": "MaxEnt clips token-level ratios (epsilon, epsilon_high)",
    "delta": "MaxEnt clips ratios with epsilon / epsilon_high only",
    "top_entropy_quantile": "MaxEnt trains on every completion token",
    "off_policy_mask_threshold": "MaxEnt weights are non-negative; nothing to mask",
    "use_bias_correction_kl": "TRL's KL penalty is not used; the KL enters through the weights",
    "entropy_coef": "MaxEnt's entropy knob is maxent_tau (or maxent_target_weight_entropy)",
    "use_adaptive_entropy": "use maxent_target_weight_entropy to adapt maxent_tau",
    "entropy_coef_min": "use maxent_tau_min",
    "entropy_coef_max": "use maxent_tau_max",
    "entropy_coef_delta": "use maxent_tau_lr",
    "entropy_target": "use maxent_target_weight_entropy",
    "entropy_normalize_by_max": "it scales entropy_coef, which MaxEnt-GRPO does not use",
    "entropy_kl_threshold": "it adapts entropy_coef, which MaxEnt-GRPO does not use",
    "sapo_temperature_neg": "it only applies to loss_type sapo",
    "sapo_temperature_pos": "it only applies to loss_type sapo",
    "vespo_k_pos": "it only applies to loss_type vespo",
    "vespo_lambda_pos": "it only applies to loss_type vespo",
    "vespo_k_neg": "it only applies to loss_type vespo",
    "vespo_lambda_neg": "it only applies to loss_type vespo",
}
# Values of those keys besides TRL's default that change nothing for MaxEnt-GRPO, e.g. an
# open-r1 recipe's `scale_rewards: false`: MaxEnt never scales rewards by their spread.
_NEUTRAL_VALUES = {"scale_rewards": ("none",)}
_TAU_KNOBS = ("maxent_tau_lr", "maxent_tau_min", "maxent_tau_max")


def _maxent_checks(values: Any) -> list:
    return [
        lambda: check_unused_trl_keys(values),
        lambda: check_maxent_weights(values),
        lambda: check_maxent_kl(values),
        lambda: check_tau_controller(values),
    ]


def check_unused_trl_keys(values: Any) -> None:
    for key, why in _UNUSED_TRL_KEYS.items():
        value = getattr(values, key)
        if value != schema.default(key, "grpo") and value not in _NEUTRAL_VALUES.get(key, ()):
            raise ConfigError(f"{key}: {value!r} is not used by MaxEnt-GRPO ({why}); remove {key}")


def check_maxent_weights(values: Any) -> None:
    """The target's floor against the group size."""
    eps = values.maxent_q_epsilon
    sizes = {values.num_generations, values.num_generations_eval or values.num_generations}
    k = max(s for s in sizes if s is not None)
    if k * eps >= 1:
        raise ConfigError(
            f"maxent_q_epsilon: {eps}: needs 0 <= eps and num_generations ({k}) x eps < 1 so "
            f"the floored target stays a distribution; set maxent_q_epsilon below {1 / k:.4g}"
        )


def check_maxent_kl(values: Any) -> None:
    """TRL's beta is set from init_kl_coeff: MaxEnt adds no per-token KL penalty."""
    if values.beta not in (0.0, values.init_kl_coeff):
        raise ConfigError(
            f"beta: {values.beta}: MaxEnt-GRPO does not add TRL's per-token KL penalty; its KL "
            f"coefficient is init_kl_coeff, used in the weights; set init_kl_coeff: "
            f"{values.beta} and remove beta"
        )
    if values.sync_ref_model and not values.init_kl_coeff > 0:
        raise ConfigError(
            "sync_ref_model: true needs a reference model; set init_kl_coeff > 0 or "
            "remove sync_ref_model"
        )


def check_tau_controller(values: Any) -> None:
    """The adaptive tau's knobs (each one's range, maxent_tau > 0 included, is on its field)."""
    target = values.maxent_target_weight_entropy
    if target is None:
        for knob in _TAU_KNOBS:
            if getattr(values, knob) != schema.default(knob, "maxent"):
                raise ConfigError(
                    f"{knob}: {getattr(values, knob)} only applies to the adaptive tau; set "
                    f"maxent_target_weight_entropy or remove {knob}"
                )
        return
    max_entropy = math.log(values.num_generations)
    if not 0 < target < max_entropy:
        raise ConfigError(
            f"maxent_target_weight_entropy: {target}: must lie strictly between 0 (one-hot "
            f"weights) and log(num_generations) = {max_entropy:.4g} (uniform weights)"
        )
    if not values.maxent_tau_min <= values.maxent_tau <= values.maxent_tau_max:
        raise ConfigError(
            f"maxent_tau: {values.maxent_tau}: must lie in [maxent_tau_min, maxent_tau_max] = "
            f"[{values.maxent_tau_min}, {values.maxent_tau_max}]; change maxent_tau or the bounds"
        )
