"""Controllers for MaxEnt-GRPO's two temperatures: beta (KL to the reference) and tau (entropy).

Plain classes with state_dict/load_state_dict; the trainer steps them once per optimizer step
and saves their state in every checkpoint. State is a dict of Python floats, so a JSON round
trip restores it exactly.
"""

from __future__ import annotations

import math


class KLController:
    """Adaptive KL coefficient of Ziegler et al. (2019), "Fine-Tuning Language Models from
    Human Preferences", section 2.2:

        beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n / horizon)

    n is the number of samples since the last update. Too much KL raises beta (a stronger pull
    toward the reference), too little lowers it. Without target/horizon beta stays fixed.
    """

    ERROR_CLIP = 0.2

    def __init__(self, init_beta: float, target: float | None = None, horizon: int | None = None):
        if init_beta < 0:
            raise ValueError(f"init_beta must be >= 0, got {init_beta}")
        if (target is None) != (horizon is None):
            raise ValueError("set both target and horizon for an adaptive beta, or neither")
        if target is not None and (target <= 0 or horizon <= 0 or init_beta <= 0):
            raise ValueError("an adaptive beta needs target > 0, horizon > 0 and init_beta > 0")
        self.beta = float(init_beta)
        self.target = target
        self.horizon = horizon

    @property
    def adaptive(self) -> bool:
        return self.target is not None

    def update(self, kl: float, num_samples: int) -> float:
        """Step beta with the KL measured on num_samples samples; returns the new beta.

        A non-finite KL (e.g. no tokens were measured) leaves beta unchanged.
        """
        if not self.adaptive or not math.isfinite(kl) or num_samples <= 0:
            return self.beta
        error = min(max(kl / self.target - 1.0, -self.ERROR_CLIP), self.ERROR_CLIP)
        self.beta = float(self.beta * (1.0 + error * num_samples / self.horizon))
        return self.beta

    def state_dict(self) -> dict:
        return {"beta": self.beta}

    def load_state_dict(self, state: dict) -> None:
        self.beta = float(state["beta"])


class TauController:
    """Entropy temperature tau steered toward a target mean weight entropy (in nats).

        log tau <- log tau + lr * (target - H),   then clipped to [tau_min, tau_max]

    Higher tau flattens the weights (higher entropy), so weights sharper than the target raise
    tau and flatter ones lower it. Multiplicative steps keep tau positive and make lr
    scale-free. Without a target tau stays fixed. The trainer measures H over the groups whose
    rewards differ: in the others the weights barely depend on tau.
    """

    def __init__(
        self,
        tau: float,
        target_entropy: float | None = None,
        lr: float = 0.0,
        tau_min: float = 0.0,
        tau_max: float = math.inf,
    ):
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        if target_entropy is not None and not (lr > 0 and 0 < tau_min <= tau <= tau_max):
            raise ValueError("an adaptive tau needs lr > 0 and 0 < tau_min <= tau <= tau_max")
        self.tau = float(tau)
        self.target_entropy = target_entropy
        self.lr = lr
        self.tau_min = tau_min
        self.tau_max = tau_max

    @property
    def adaptive(self) -> bool:
        return self.target_entropy is not None

    def update(self, entropy: float) -> float:
        """Step tau with the measured mean weight entropy; returns the new tau."""
        if not self.adaptive or not math.isfinite(entropy):
            return self.tau
        tau = self.tau * math.exp(self.lr * (self.target_entropy - entropy))
        self.tau = float(min(max(tau, self.tau_min), self.tau_max))
        return self.tau

    def state_dict(self) -> dict:
        return {"tau": self.tau}

    def load_state_dict(self, state: dict) -> None:
        self.tau = float(state["tau"])
