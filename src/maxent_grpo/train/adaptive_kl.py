"""Adaptive KL coefficient for GRPO: TRL's `beta` steered toward `kl_target`.

The controller (`KLController`, Ziegler et al. 2019; MaxEnt-GRPO steers its beta with it too):
after every optimizer step, beta <- beta * (1 + clip(KL / kl_target - 1, -0.2, 0.2) * n /
kl_horizon), with KL the mean of TRL's `kl` metric (per-token k3 estimate of KL(policy ||
reference), gathered over processes) over the step's micro-batches and n the step's
completions over all processes. TRL reads `self.beta` at every loss, so the new value applies
from the next step. Its state is registered as `kl_controller` (train/state.py): saved in
each checkpoint and restored on resume.

Hook (train/components.py): `_compute_loss` (TRL's, then its `kl` metric read).
"""

from __future__ import annotations

import math

from maxent_grpo.train import trl_adapter
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


class AdaptiveKL:
    """Component (train/components.py), on with kl_target: steers TRL's `beta` after every
    optimizer step from the KL TRL measured in its micro-batches."""

    name = "adaptive_kl"
    needs = ()

    def __init__(self, trainer):
        self.trainer = trainer
        config = trainer.args
        self.controller = KLController(trainer.beta, config.kl_target, config.kl_horizon)
        self._kl_window: list[float] = []  # TRL's kl of each micro-batch of this step
        self._kl_completions = 0  # completions of this step, over all processes
        state_registry(trainer).register("kl_controller", self.controller.state_dict, self._load)

    def _load(self, state: dict) -> None:
        self.controller.load_state_dict(state)
        self.trainer.beta = self.controller.beta

    def loss(self, call, model, inputs):
        loss = call(model, inputs)
        trainer = self.trainer
        if trainer.model.training:
            metrics = trl_adapter.metrics(trainer)
            metrics["beta"].append(trainer.beta)  # the beta this micro-batch's loss used
            self._kl_window.append(metrics["kl"][-1])  # appended by TRL just now
            processes = trainer.accelerator.num_processes
            self._kl_completions += inputs["completion_ids"].size(0) * processes
            if trainer.accelerator.sync_gradients:
                self._step()
        return loss

    def _step(self) -> None:
        kl = sum(self._kl_window) / len(self._kl_window)
        self.trainer.beta = self.controller.update(kl, self._kl_completions)
        self._kl_window, self._kl_completions = [], 0
