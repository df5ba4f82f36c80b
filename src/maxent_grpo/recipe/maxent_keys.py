"""The training section of a MaxEnt-GRPO recipe: our GRPOConfig plus the MaxEnt knobs.

Every key has one meaning. TRL's `beta` is not a separate knob here: it is set from
init_kl_coeff so that TRL builds the reference model and computes its log-probs, while the
MaxEnt trainer never adds TRL's per-token KL penalty (the KL enters through the weights).
TRL loss keys the MaxEnt loss does not use are rejected rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from trl import ModelConfig

from maxent_grpo.recipe.declare import Accepts
from maxent_grpo.recipe.keys import GRPOConfig, LauncherKeys, ScriptArguments


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

    METHOD = "maxent"  # recipe/rules.py: GRPO's rules and MaxEnt's

    def _set_beta(self) -> None:
        # TRL builds the reference model and computes its log-probs iff beta != 0; the MaxEnt
        # loss replaces TRL's, so TRL's per-token KL penalty is never added.
        self.beta = self.init_kl_coeff


MAXENT_TYPES = (ScriptArguments, MaxEntConfig, ModelConfig, LauncherKeys)
