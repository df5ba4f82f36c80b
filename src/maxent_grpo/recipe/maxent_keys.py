"""The training section of a MaxEnt-GRPO recipe: our GRPOConfig plus the MaxEnt knobs.

Every key has one meaning. TRL's `beta` is not a separate knob here: it is set from
init_kl_coeff so that TRL builds the reference model and computes its log-probs, while the
MaxEnt trainer never adds TRL's per-token KL penalty (the KL enters through the weights).
TRL loss keys the MaxEnt loss does not use are rejected rather than silently ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Annotated, Any

from trl import ModelConfig

from maxent_grpo.recipe.declare import Accepts
from maxent_grpo.recipe.keys import ConfigError, GRPOConfig, LauncherKeys, ScriptArguments
from maxent_grpo.recipe.problems import run_checks

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
_TRL_DEFAULTS = {f.name: f.default for f in fields(GRPOConfig)}  # TRL's and our GRPO keys
# Values of those keys besides TRL's default that change nothing for MaxEnt-GRPO, e.g. an
# open-r1 recipe's `scale_rewards: false`: MaxEnt never scales rewards by their spread.
_NEUTRAL_VALUES = {"scale_rewards": ("none",)}


@dataclass
class MaxEntConfig(GRPOConfig):
    """GRPOConfig plus the MaxEnt-GRPO knobs (see src/maxent_grpo/maxent/README.md)."""

    maxent_tau: Annotated[float, Accepts(range=(">", 0))] = field(
        default=1.0,
        metadata={
            "help": "Entropy temperature tau (> 0) of the weights w = softmax(log q / (tau + "
            "beta) + beta / (tau + beta) * log pi_ref). Large tau: uniform weights (the Dr. GRPO "
            "limit); small tau with beta 0: all weight on the best completion. The initial value "
            "when maxent_target_weight_entropy is set."
        },
    )
    maxent_q_temperature: Annotated[float, Accepts(range=(">", 0))] = field(
        default=1.0,
        metadata={
            "help": "Temperature T (> 0) of the listwise target q = softmax(reward / T) over each "
            "prompt's completions, in reward units: smaller T makes q greedier."
        },
    )
    maxent_q_epsilon: Annotated[float, Accepts(range=(">=", 0))] = field(
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
    maxent_target_weight_entropy: float | None = field(
        default=None,
        metadata={
            "help": "Target mean entropy of each prompt's weights, in nats, between 0 (one-hot) "
            "and log(num_generations) (uniform), over the groups whose rewards differ. Set: tau "
            "adapts every optimizer step, log tau += maxent_tau_lr * (target - entropy). "
            "Unset: tau stays maxent_tau."
        },
    )
    # The tau controller's knobs: their defaults here are the only ones (the trainer reads them).
    maxent_tau_lr: Annotated[float, Accepts(range=(">", 0))] = field(
        default=0.1,
        metadata={
            "help": "Step size of the tau controller, per nat of entropy error. Only with "
            "maxent_target_weight_entropy."
        },
    )
    maxent_tau_min: Annotated[float, Accepts(range=(">", 0))] = field(
        default=1.0e-3,
        metadata={
            "help": "Lower bound of the adaptive tau. Only with maxent_target_weight_entropy."
        },
    )
    maxent_tau_max: Annotated[float, Accepts(range=(">", 0))] = field(
        default=1.0e3,
        metadata={
            "help": "Upper bound of the adaptive tau. Only with maxent_target_weight_entropy."
        },
    )

    def _check_section(self) -> None:
        run_checks(
            self._check_unused_trl_keys,
            self._check_weights,
            self._check_kl,
            self._check_tau_controller,
        )
        # TRL builds the reference model and computes its log-probs iff beta != 0; the MaxEnt
        # loss replaces TRL's, so TRL's per-token KL penalty is never added. GRPOConfig checks
        # init_kl_coeff and the adaptive beta (kl_target, kl_horizon), shared with GRPO.
        self.beta = self.init_kl_coeff
        super()._check_section()

    def _check_unused_trl_keys(self) -> None:
        for key, why in _UNUSED_TRL_KEYS.items():
            value = getattr(self, key)
            if value != _TRL_DEFAULTS[key] and value not in _NEUTRAL_VALUES.get(key, ()):
                raise ConfigError(
                    f"{key}: {value!r} is not used by MaxEnt-GRPO ({why}); remove {key}"
                )

    def _check_weights(self) -> None:
        """The floor against the group size (the ranges are declared with the fields)."""
        eps = self.maxent_q_epsilon
        sizes = {self.num_generations, self.num_generations_eval or self.num_generations}
        k = max(s for s in sizes if s is not None)
        if k * eps >= 1:
            raise ConfigError(
                f"maxent_q_epsilon: {eps}: needs 0 <= eps and num_generations ({k}) x eps < 1 so "
                f"the floored target stays a distribution; set maxent_q_epsilon below {1 / k:.4g}"
            )

    def _check_kl(self) -> None:
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

    def _check_tau_controller(self) -> None:
        """Rules across keys; each knob's own range (> 0) is declared with its field."""
        target = self.maxent_target_weight_entropy
        if target is None:
            for knob in _TAU_KNOBS:
                if getattr(self, knob) != _DEFAULTS[knob]:
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
        if not self.maxent_tau_min <= self.maxent_tau <= self.maxent_tau_max:
            raise ConfigError(
                f"maxent_tau: {self.maxent_tau}: must lie in [maxent_tau_min, maxent_tau_max] = "
                f"[{self.maxent_tau_min}, {self.maxent_tau_max}]; change maxent_tau or the bounds"
            )


_TAU_KNOBS = ("maxent_tau_lr", "maxent_tau_min", "maxent_tau_max")
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(MaxEntConfig)}

MAXENT_TYPES = (ScriptArguments, MaxEntConfig, ModelConfig, LauncherKeys)
