"""Adaptive KL coefficient for GRPO: TRL's `beta` steered toward `kl_target`.

The controller (`KLController`, Ziegler et al. 2019; MaxEnt-GRPO steers its beta with it too):
after every optimizer step, beta <- beta * (1 + clip(KL / kl_target - 1, -0.2, 0.2) * n /
kl_horizon), with KL the mean of TRL's `kl` metric (per-token k3 estimate of KL(policy ||
reference), gathered over processes) over the step's micro-batches and n the step's
completions over all processes. TRL reads `self.beta` at every loss, so the new value applies
from the next step. Its state is registered as `kl_controller` (train/state.py): saved in
each checkpoint and restored on resume.

Overrides (see docs/architecture.md): `_compute_loss` (called, then TRL's `_metrics` read).
"""

from __future__ import annotations

import math

from maxent_grpo.train.state import state_registry


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


class AdaptiveKLMixin:
    """For a TRL GRPOTrainer whose args are our GRPOConfig (init_kl_coeff, kl_target, kl_horizon).

    Without kl_target it changes nothing: beta stays TRL's and no state is registered.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.args
        target = getattr(config, "kl_target", None)
        horizon = getattr(config, "kl_horizon", None)
        self.kl_controller = KLController(self.beta, target, horizon)
        self._kl_window: list[float] = []  # TRL's kl of each micro-batch of this step
        self._kl_completions = 0  # completions of this step, over all processes
        if self.kl_controller.adaptive:
            state_registry(self).register(
                "kl_controller", self.kl_controller.state_dict, self._load_kl_controller
            )

    def _load_kl_controller(self, state: dict) -> None:
        self.kl_controller.load_state_dict(state)
        self.beta = self.kl_controller.beta

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        if self.kl_controller.adaptive and self.model.training:
            metrics = self._metrics["train"]
            metrics["beta"].append(self.beta)  # the beta this micro-batch's loss used
            self._kl_window.append(metrics["kl"][-1])  # appended by TRL just now
            processes = self.accelerator.num_processes
            self._kl_completions += inputs["completion_ids"].size(0) * processes
            if self.accelerator.sync_gradients:
                self._step_kl_controller()
        return loss

    def _step_kl_controller(self) -> None:
        kl = sum(self._kl_window) / len(self._kl_window)
        self.beta = self.kl_controller.update(kl, self._kl_completions)
        self._kl_window, self._kl_completions = [], 0
