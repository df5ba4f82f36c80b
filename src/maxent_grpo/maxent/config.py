"""MaxEnt-GRPO recipe keys: our GRPOConfig plus the MaxEnt knobs, validated up front.

Every key has one meaning. TRL's `beta` is not a separate knob here: it is set from
init_kl_coeff so that TRL builds the reference model and computes its log-probs, while the
MaxEnt trainer never adds TRL's per-token KL penalty (the KL enters through the weights).
TRL loss keys the MaxEnt loss does not use are rejected rather than silently ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import trl
from trl import ModelConfig

from maxent_grpo.configs import (
    ConfigError,
    GRPOConfig,
    LaunchArguments,
    ScriptArguments,
    world_size_from_env,
)

# Defaults of the tau controller, used when maxent_target_weight_entropy is set.
DEFAULT_TAU_LR = 0.1
DEFAULT_TAU_MIN = 1.0e-3
DEFAULT_TAU_MAX = 1.0e3

# TRL GRPO keys with no meaning for the MaxEnt loss, and what to use instead.
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
    "sapo_temperature_neg": "it only applies to loss_type sapo",
    "sapo_temperature_pos": "it only applies to loss_type sapo",
    "vespo_k_pos": "it only applies to loss_type vespo",
    "vespo_lambda_pos": "it only applies to loss_type vespo",
    "vespo_k_neg": "it only applies to loss_type vespo",
    "vespo_lambda_neg": "it only applies to loss_type vespo",
}
_TRL_DEFAULTS = {f.name: f.default for f in fields(trl.GRPOConfig)}


@dataclass
class MaxEntConfig(GRPOConfig):
    """GRPOConfig plus the MaxEnt-GRPO knobs (see src/maxent_grpo/maxent/README.md)."""

    maxent_tau: float = field(
        default=1.0,
        metadata={
            "help": "Entropy temperature tau (> 0) of the weights w = softmax(log q / (tau + "
            "beta) + beta / (tau + beta) * log pi_ref). Large tau: uniform weights (the Dr. GRPO "
            "limit); small tau with beta 0: all weight on the best completion. The initial value "
            "when maxent_target_weight_entropy is set."
        },
    )
    maxent_q_temperature: float = field(
        default=1.0,
        metadata={
            "help": "Temperature T (> 0) of the listwise target q = softmax(reward / T) over each "
            "prompt's completions, in reward units: smaller T makes q greedier."
        },
    )
    maxent_q_epsilon: float = field(
        default=0.01,
        metadata={
            "help": "Floor eps of the target: q <- (1 - K eps) q + eps, so every completion "
            "keeps at least eps of mass. Needs num_generations x eps < 1; 0 turns it off."
        },
    )
    maxent_length_normalize_ref: bool = field(
        default=True,
        metadata={
            "help": "Divide each completion's reference log-likelihood log pi_ref(y | x) by its "
            "token count (true), or use the sum over tokens (false), in the weights."
        },
    )
    init_kl_coeff: float = field(
        default=0.0,
        metadata={
            "help": "Initial KL coefficient beta (>= 0) of the weights: how strongly they favour "
            "completions the reference model finds likely. > 0 loads a reference model (TRL's "
            "`beta` is set from it; do not set `beta`). 0: no reference model."
        },
    )
    kl_target: float | None = field(
        default=None,
        metadata={
            "help": "Target KL(policy || reference) per completion token (the maxent/kl metric). "
            "With kl_horizon, beta adapts every optimizer step (Ziegler et al. 2019). Needs "
            "init_kl_coeff > 0. Unset: beta stays init_kl_coeff."
        },
    )
    kl_horizon: int | None = field(
        default=None,
        metadata={
            "help": "Horizon (in completions) of the adaptive beta: beta <- beta * (1 + "
            "clip(KL / kl_target - 1, -0.2, 0.2) * n / kl_horizon), n = completions per optimizer "
            "step. Set together with kl_target; at least one step's completions."
        },
    )
    maxent_target_weight_entropy: float | None = field(
        default=None,
        metadata={
            "help": "Target mean entropy of each prompt's weights, in nats, between 0 (one-hot) "
            "and log(num_generations) (uniform), over the groups whose rewards differ. Set: tau "
            "adapts every optimizer step, log tau += maxent_tau_lr * (target - entropy). "
            "Unset: tau stays maxent_tau."
        },
    )
    maxent_tau_lr: float | None = field(
        default=None,
        metadata={
            "help": "Step size of the tau controller, per nat of entropy error (default "
            f"{DEFAULT_TAU_LR}). Only with maxent_target_weight_entropy."
        },
    )
    maxent_tau_min: float | None = field(
        default=None,
        metadata={
            "help": f"Lower bound of the adaptive tau (default {DEFAULT_TAU_MIN}). Only with "
            "maxent_target_weight_entropy."
        },
    )
    maxent_tau_max: float | None = field(
        default=None,
        metadata={
            "help": f"Upper bound of the adaptive tau (default {DEFAULT_TAU_MAX}). Only with "
            "maxent_target_weight_entropy."
        },
    )

    def __post_init__(self):
        self._check_unused_trl_keys()
        self._check_weights()
        self._check_kl()
        self._check_tau_controller()
        # TRL builds the reference model and computes its log-probs iff beta != 0; the MaxEnt
        # loss replaces TRL's, so TRL's per-token KL penalty is never added.
        self.beta = self.init_kl_coeff
        super().__post_init__()

    def _check_unused_trl_keys(self) -> None:
        for key, why in _UNUSED_TRL_KEYS.items():
            value, default = getattr(self, key), _TRL_DEFAULTS[key]
            if value != default:
                raise ConfigError(
                    f"{key}: {value!r} is not used by MaxEnt-GRPO ({why}); remove {key}"
                )

    def _check_weights(self) -> None:
        if not self.maxent_tau > 0:
            raise ConfigError(f"maxent_tau: {self.maxent_tau}: must be > 0; e.g. maxent_tau: 1.0")
        if not self.maxent_q_temperature > 0:
            raise ConfigError(
                f"maxent_q_temperature: {self.maxent_q_temperature}: must be > 0; "
                "e.g. maxent_q_temperature: 1.0"
            )
        eps = self.maxent_q_epsilon
        sizes = {self.num_generations, self.num_generations_eval or self.num_generations}
        k = max(s for s in sizes if s is not None)
        if eps < 0 or k * eps >= 1:
            raise ConfigError(
                f"maxent_q_epsilon: {eps}: needs 0 <= eps and num_generations ({k}) x eps < 1 so "
                f"the floored target stays a distribution; set maxent_q_epsilon below {1 / k:.4g}"
            )

    def _check_kl(self) -> None:
        if not self.init_kl_coeff >= 0:
            raise ConfigError(f"init_kl_coeff: {self.init_kl_coeff}: must be >= 0")
        if self.beta not in (0.0, self.init_kl_coeff):
            raise ConfigError(
                f"beta: {self.beta}: MaxEnt-GRPO does not add TRL's per-token KL penalty; its KL "
                f"coefficient is init_kl_coeff, used in the weights; set init_kl_coeff: "
                f"{self.beta} and remove beta"
            )
        if self.sync_ref_model and not self.init_kl_coeff > 0:
            raise ConfigError(
                "sync_ref_model: true needs a reference model; set init_kl_coeff > 0 or "
                "remove sync_ref_model"
            )
        if (self.kl_target is None) != (self.kl_horizon is None):
            missing = "kl_horizon" if self.kl_horizon is None else "kl_target"
            raise ConfigError(
                f"{missing}: not set; an adaptive beta needs both kl_target and kl_horizon "
                "(e.g. kl_target: 0.05, kl_horizon: 10000), or neither for a fixed beta"
            )
        if self.kl_target is None:
            return
        if not self.kl_target > 0:
            raise ConfigError(f"kl_target: {self.kl_target}: must be > 0, e.g. 0.05")
        if not self.init_kl_coeff > 0:
            raise ConfigError(
                f"init_kl_coeff: {self.init_kl_coeff}: an adaptive beta (kl_target) multiplies "
                "beta, so it must start > 0; set init_kl_coeff, e.g. 0.05"
            )
        per_step = (
            self.per_device_train_batch_size
            * self.gradient_accumulation_steps
            * world_size_from_env()
        )
        if self.kl_horizon < per_step:
            raise ConfigError(
                f"kl_horizon: {self.kl_horizon}: below the {per_step} completions of one "
                "optimizer step (per_device_train_batch_size x gradient_accumulation_steps x "
                f"processes), so one update could move beta by over 20%; set kl_horizon >= "
                f"{per_step} (Ziegler et al. use 10000)"
            )

    def _check_tau_controller(self) -> None:
        knobs = ("maxent_tau_lr", "maxent_tau_min", "maxent_tau_max")
        target = self.maxent_target_weight_entropy
        if target is None:
            for knob in knobs:
                if getattr(self, knob) is not None:
                    raise ConfigError(
                        f"{knob}: {getattr(self, knob)} only applies to the adaptive tau; set "
                        f"maxent_target_weight_entropy or remove {knob}"
                    )
            return
        max_entropy = math.log(self.num_generations)
        if not 0 < target < max_entropy:
            raise ConfigError(
                f"maxent_target_weight_entropy: {target}: must lie strictly between 0 (one-hot "
                f"weights) and log(num_generations) = {max_entropy:.4g} (uniform weights)"
            )
        if self.maxent_tau_lr is None:
            self.maxent_tau_lr = DEFAULT_TAU_LR
        if self.maxent_tau_min is None:
            self.maxent_tau_min = DEFAULT_TAU_MIN
        if self.maxent_tau_max is None:
            self.maxent_tau_max = DEFAULT_TAU_MAX
        if not self.maxent_tau_lr > 0:
            raise ConfigError(f"maxent_tau_lr: {self.maxent_tau_lr}: must be > 0, e.g. 0.1")
        if not 0 < self.maxent_tau_min <= self.maxent_tau <= self.maxent_tau_max:
            raise ConfigError(
                f"maxent_tau: {self.maxent_tau}: must lie in [maxent_tau_min, maxent_tau_max] = "
                f"[{self.maxent_tau_min}, {self.maxent_tau_max}] with maxent_tau_min > 0; "
                "change maxent_tau or the bounds"
            )


MAXENT_TYPES = (ScriptArguments, MaxEntConfig, ModelConfig, LaunchArguments)
