"""MaxEnt-GRPO on TRL's GRPOTrainer: same generation, rewards, logging and checkpoints.

MaxEntGRPOTrainer is our GRPO trainer (train/trl_adapter.py `HookedTrainer` over TRL's
GRPOTrainer, with the components of train/components.py) plus the `MaxEnt` component, the
innermost of its list. Its hooks, and why:
- `_calculate_rewards`: keep TRL's rewards (already gathered across processes), which TRL turns
  into advantages and drops.
- `_generate_and_score_completions`: after TRL, compute the MaxEnt weights of every group from
  the gathered rewards and reference log-likelihoods, then keep this process's slice (with
  rollout rounds, once per round: the Rollouts component calls it).
- `_compute_loss`: the weighted log-likelihood replaces TRL's loss (so TRL's per-token KL
  penalty is never added); measure the KL to the reference and step the controllers.

The controllers' state is registered (`maxent_controllers`, train/state.py): in every checkpoint.
"""

from __future__ import annotations

import torch
import trl

from maxent_grpo.maxent.controllers import TauController
from maxent_grpo.maxent.weights import (
    informative_groups,
    maxent_weights,
    sequence_log_likelihood,
    weight_stats,
    weighted_policy_loss,
)
from maxent_grpo.recipe.maxent_keys import MaxEntConfig
from maxent_grpo.train import trl_adapter
from maxent_grpo.train.adaptive_kl import KLController
from maxent_grpo.train.state import state_registry
from maxent_grpo.train.trl_adapter import HookedTrainer

# Model inputs besides ids and mask that TRL forwards for multimodal models.
_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
# Bound on |log pi_ref - log pi| per token in the KL estimate: exp() of more overflows.
_MAX_LOG_RATIO = 20.0


def _loss_mask(batch: dict) -> torch.Tensor:
    mask = batch["completion_mask"]
    return mask if "tool_mask" not in batch else mask * batch["tool_mask"]


class MaxEnt:
    """Component: the MaxEnt weights of every group and the weighted loss, with the beta and
    tau controllers."""

    name = "maxent"
    needs = ()

    def __init__(self, trainer):
        self.trainer = trainer
        config = trainer.args
        if not isinstance(config, MaxEntConfig):
            raise TypeError(f"MaxEntGRPOTrainer needs a MaxEntConfig, got {type(config).__name__}")
        self.kl_controller = KLController(config.init_kl_coeff, config.kl_target, config.kl_horizon)
        self.tau_controller = TauController(
            config.maxent_tau,
            config.maxent_target_weight_entropy,
            lr=config.maxent_tau_lr,
            tau_min=config.maxent_tau_min,
            tau_max=config.maxent_tau_max,
        )
        self._gathered_rewards = None
        # Measurements since the last optimizer step, consumed by the controllers at its end.
        self._kl_window = torch.zeros(3, dtype=torch.float64)  # KL sum, tokens, completions
        self._pending_entropies: list[float] = []
        state_registry(trainer).register(
            "maxent_controllers", self.controller_state, self.load_controller_state
        )

    # ---- weights -------------------------------------------------------------------------

    def rewards(self, call, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = call(inputs, prompts, completions, completion_ids_list)
        self._gathered_rewards = rewards_per_func
        return rewards_per_func

    def generate_and_score(self, call, inputs):
        output = call(inputs)
        trainer = self.trainer
        mode = "train" if trainer.model.training else "eval"
        group_size = trainer.num_generations if mode == "train" else trainer.num_generations_eval
        rewards_per_func, self._gathered_rewards = self._gathered_rewards, None

        # TRL's weighted sum; NaN (no weight) where every reward function returned None.
        weights_per_func = trainer.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        rewards = (rewards_per_func * weights_per_func).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan

        ref_ll = None
        if "ref_per_token_logps" in output:
            local_ll = sequence_log_likelihood(
                output["ref_per_token_logps"],
                _loss_mask(output),
                trainer.args.maxent_length_normalize_ref,
            )
            # Same process-major order as TRL's reward gather, so groups line up.
            ref_ll = trainer.accelerator.gather(local_ll)

        tau, beta = self.tau_controller.tau, self.kl_controller.beta
        weights = maxent_weights(
            rewards,
            group_size,
            tau=tau,
            beta=beta,
            ref_log_likelihood=ref_ll,
            q_temperature=trainer.args.maxent_q_temperature,
            q_epsilon=trainer.args.maxent_q_epsilon,
        )
        metrics = trl_adapter.metrics(trainer, mode)
        stats = weight_stats(weights, group_size)
        if stats is not None:
            metrics["maxent/weight_entropy"].append(stats.entropy)
            metrics["maxent/ess"].append(stats.ess)
            metrics["maxent/max_weight"].append(stats.max_weight)
        # The tau controller only looks at groups whose rewards differ (see informative_groups).
        informative = weight_stats(weights, group_size, informative_groups(rewards, group_size))
        if mode == "train" and informative is not None:
            self._pending_entropies.append(informative.entropy)

        # Every process computed all weights; keep this process's slice, as TRL does.
        n_local = output["completion_ids"].size(0)
        start = trainer.accelerator.process_index * n_local
        output["maxent_weights"] = weights[start : start + n_local].to(
            output["completion_ids"].device
        )
        return output

    # ---- loss ----------------------------------------------------------------------------

    def loss(self, call, model, inputs):
        """Replaces TRL's loss: `call` (TRL's) is not called."""
        trainer = self.trainer
        mode = "train" if trainer.model.training else "eval"
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        per_token_logps, entropies, aux_loss = trl_adapter.per_token_logps_and_entropies(
            trainer,
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=trainer.aux_loss_enabled,
            **{key: inputs.get(key) for key in _FORWARD_KEYS},
        )
        mask = _loss_mask(inputs)
        old_per_token_logps = inputs.get("old_per_token_logps")
        if old_per_token_logps is None:  # on-policy: TRL skips computing it
            old_per_token_logps = per_token_logps.detach()
        sampling_correction = trainer.use_vllm and trainer.vllm_importance_sampling_correction
        group_size = trainer.num_generations if mode == "train" else trainer.num_generations_eval

        # Scaling by K makes the batch mean equal sum_i w_i (...) averaged over groups.
        per_completion = weighted_policy_loss(
            per_token_logps,
            old_per_token_logps,
            mask,
            inputs["maxent_weights"] * group_size,
            trainer.epsilon_low,
            trainer.epsilon_high,
            inputs["importance_sampling_ratio"] if sampling_correction else None,
        )
        normalizer = trainer.current_gradient_accumulation_steps if mode == "train" else 1.0
        loss = per_completion.mean() / normalizer
        if trainer.aux_loss_enabled:
            loss = loss + trainer.router_aux_loss_coef * aux_loss / normalizer
            aux = trainer.accelerator.gather_for_metrics(aux_loss).mean().item()
            trl_adapter.metrics(trainer, mode)["aux_loss"].append(aux)

        self._log_and_control(
            mode, inputs, per_token_logps.detach(), old_per_token_logps, mask, entropies
        )
        return loss

    def _log_and_control(self, mode, inputs, logps, old_logps, mask, entropies) -> None:
        """Log this micro-batch's metrics; at the end of an optimizer step, step the controllers."""
        # float32 at least: the sums below run over many tokens.
        logps, mask, entropies = logps.float(), mask.float(), entropies.float()
        ratio = torch.exp(logps - old_logps.float())
        clipped = (ratio > 1 + self.trainer.epsilon_high).to(
            logps.dtype
        )  # weights >= 0: upper clip only
        kl_sum = torch.zeros((), dtype=logps.dtype, device=logps.device)
        if "ref_per_token_logps" in inputs:
            # k3 estimator of KL(pi || pi_ref), as TRL's `kl` metric; measured, not optimised.
            log_ratio = (inputs["ref_per_token_logps"].float() - logps).clamp(
                -_MAX_LOG_RATIO, _MAX_LOG_RATIO
            )
            kl_sum = ((torch.exp(log_ratio) - log_ratio - 1) * mask).sum()
        local = torch.stack(
            [
                (entropies * mask).sum(),
                (clipped * mask).sum(),
                mask.sum(),
                kl_sum,
                torch.tensor(float(logps.size(0)), dtype=logps.dtype, device=logps.device),
            ]
        )
        entropy_sum, clipped_sum, tokens, kl_total, completions = (
            self.trainer.accelerator.reduce(local, reduction="sum").double().cpu().tolist()
        )
        metrics = trl_adapter.metrics(self.trainer, mode)
        metrics["entropy"].append(entropy_sum / max(tokens, 1.0))
        metrics["clip_ratio/high_mean"].append(clipped_sum / max(tokens, 1.0))
        metrics["maxent/beta"].append(self.kl_controller.beta)
        metrics["maxent/tau"].append(self.tau_controller.tau)
        if "ref_per_token_logps" in inputs:
            metrics["maxent/kl"].append(kl_total / max(tokens, 1.0))

        if mode != "train":
            return
        self._kl_window += torch.tensor([kl_total, tokens, completions], dtype=torch.float64)
        if self.trainer.accelerator.sync_gradients:
            self._step_controllers()

    def _step_controllers(self) -> None:
        kl_total, tokens, completions = self._kl_window.tolist()
        if tokens > 0:
            self.kl_controller.update(kl_total / tokens, int(completions))
        # TRL only tests `self.beta != 0` (reference log-probs); keep it equal to the controller.
        self.trainer.beta = self.kl_controller.beta
        if self._pending_entropies:
            entropies = self._pending_entropies
            self.tau_controller.update(sum(entropies) / len(entropies))
        self._kl_window.zero_()
        self._pending_entropies = []

    # ---- checkpoints ---------------------------------------------------------------------

    def controller_state(self) -> dict:
        return {"kl": self.kl_controller.state_dict(), "tau": self.tau_controller.state_dict()}

    def load_controller_state(self, state: dict) -> None:
        self.kl_controller.load_state_dict(state["kl"])
        self.tau_controller.load_state_dict(state["tau"])
        self.trainer.beta = self.kl_controller.beta


class MaxEntGRPOTrainer(HookedTrainer, trl.GRPOTrainer):
    """MaxEnt-GRPO: our GRPO trainer with the MaxEnt component (train/components.py)."""

    method = "maxent"
    method_component = MaxEnt
