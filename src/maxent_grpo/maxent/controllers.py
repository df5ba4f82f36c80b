"""Controllers for MaxEnt-GRPO's two temperatures: beta (KL to the reference; train/adaptive_kl.py
`KLController`, shared with GRPO's adaptive beta) and tau (entropy, here).

Plain classes with state_dict/load_state_dict; the trainer steps them once per optimizer step
and saves their state in every checkpoint. State is a dict of Python floats, so a JSON round
trip restores it exactly.
"""

from __future__ import annotations

import math


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
