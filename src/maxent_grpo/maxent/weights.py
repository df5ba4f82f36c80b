"""MaxEnt-GRPO weight math: pure torch functions, no trainer state.

For one prompt with K completions, rewards r and reference log-likelihoods l, the weights solve

    max_{w in simplex}  <w, log q> + tau * H(w) - beta * KL(w || pi_ref restricted to the group)

whose closed form is w = softmax(log q / (tau + beta) + beta / (tau + beta) * l), with the
listwise target q = softmax(r / T) floored at eps. Everything is computed in log space, so huge
rewards or log-probabilities give zero weights, never NaN or inf. See README.md for the method.

Conventions: flat tensors of length N = G * K hold G groups of K contiguous completions (the
layout of TRL's generation batch). A NaN reward marks an unscorable completion (TRL's
convention when every reward function returned None): it gets weight 0 and no support.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def _grouped(x: torch.Tensor, group_size: int) -> torch.Tensor:
    if x.dim() != 1 or x.numel() % group_size:
        raise ValueError(
            f"expected a flat tensor of whole groups of {group_size}, got shape {tuple(x.shape)}"
        )
    return x.view(-1, group_size)


def _finite(x: torch.Tensor) -> torch.Tensor:
    """Map +-inf to the largest finite values of the dtype (NaN is handled by the caller)."""
    return torch.nan_to_num(x, nan=0.0)


def _masked_log_softmax(logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """log_softmax over the valid entries of each row; -inf elsewhere and in all-invalid rows."""
    logits = logits.masked_fill(~valid, -math.inf)
    # A row with no valid entry would be NaN (-inf - -inf); give it a harmless finite row.
    empty = ~valid.any(dim=-1, keepdim=True)
    out = torch.log_softmax(logits.masked_fill(empty, 0.0), dim=-1)
    return out.masked_fill(~valid, -math.inf)


def sequence_log_likelihood(
    per_token_logps: torch.Tensor, mask: torch.Tensor, length_normalize: bool
) -> torch.Tensor:
    """log pi(y | x) of each completion: masked sum over tokens, or mean when length_normalize.

    An empty completion (no unmasked token) scores 0.
    """
    mask = mask.to(per_token_logps.dtype)
    total = (_finite(per_token_logps) * mask).sum(dim=-1)
    if length_normalize:
        total = total / mask.sum(dim=-1).clamp(min=1.0)
    return total


def listwise_target_log_q(
    rewards: torch.Tensor, group_size: int, temperature: float, epsilon: float
) -> torch.Tensor:
    """log q per group, shape (G, K): q = softmax(r / T), floored to (1 - K' eps) q + eps.

    K' is the number of scorable completions of the group, so every one of them keeps at least
    eps of mass and q still sums to 1. Unscorable (NaN-reward) completions get log q = -inf.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    r = _grouped(rewards, group_size)
    valid = ~torch.isnan(r)
    k_valid = valid.sum(dim=-1, keepdim=True).to(r.dtype)
    if epsilon < 0 or (epsilon > 0 and bool((k_valid * epsilon >= 1).any())):
        raise ValueError(
            f"epsilon must be >= 0 and K * epsilon < 1, got {epsilon} (K={group_size})"
        )
    log_q = _masked_log_softmax(_finite(r / temperature), valid)
    if epsilon > 0:
        # log((1 - K' eps) q + eps) in log space; the final log_softmax only removes rounding.
        floored = torch.logaddexp(
            torch.log1p(-k_valid * epsilon) + log_q, log_q.new_tensor(epsilon).log()
        )
        log_q = _masked_log_softmax(floored, valid)
    return log_q


def maxent_log_weights(
    log_q: torch.Tensor, ref_log_likelihood: torch.Tensor | None, tau: float, beta: float
) -> torch.Tensor:
    """log w = log_softmax(log q / (tau + beta) + beta / (tau + beta) * l) per group, (G, K).

    ref_log_likelihood: l, shape (G, K) (or None when beta == 0). -inf entries of log q stay -inf.
    """
    if tau < 0 or beta < 0 or tau + beta <= 0:
        raise ValueError(f"need tau >= 0, beta >= 0 and tau + beta > 0, got tau={tau}, beta={beta}")
    valid = torch.isfinite(log_q)
    logits = log_q / (tau + beta)
    if beta > 0:
        if ref_log_likelihood is None:
            raise ValueError("beta > 0 needs the reference log-likelihoods")
        # Clamp so that |logits| stays far from overflow whatever the log-probs are.
        limit = torch.finfo(logits.dtype).max / 4
        ref = _finite(ref_log_likelihood.to(logits.dtype)).clamp(-limit, limit)
        logits = logits + (beta / (tau + beta)) * ref
    logits = torch.where(valid, _finite(logits), logits)
    return _masked_log_softmax(logits, valid)


def maxent_weights(
    rewards: torch.Tensor,
    group_size: int,
    tau: float,
    beta: float = 0.0,
    ref_log_likelihood: torch.Tensor | None = None,
    q_temperature: float = 1.0,
    q_epsilon: float = 0.0,
) -> torch.Tensor:
    """The MaxEnt-GRPO weights of a flat batch of groups, shape (N,); each group sums to 1.

    rewards: (N,) summed rewards (NaN = unscorable). ref_log_likelihood: (N,) log pi_ref(y | x),
    needed when beta > 0. A group with no scorable completion gets all-zero weights.
    """
    # At least float32: bf16 rewards or log-probs would round the weights coarsely.
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    log_q = listwise_target_log_q(rewards.to(dtype), group_size, q_temperature, q_epsilon)
    ref = None
    if ref_log_likelihood is not None:
        ref = _grouped(ref_log_likelihood.to(dtype), group_size)
    return maxent_log_weights(log_q, ref, tau, beta).exp().reshape(-1)


@dataclass(frozen=True)
class WeightStats:
    """Per-batch summaries of the weights, averaged over groups with at least one weight."""

    entropy: float  # nats; log K for uniform weights, 0 for one-hot
    ess: float  # effective sample size 1 / sum w^2: K for uniform, 1 for one-hot
    max_weight: float  # mean over groups of the largest weight


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(G,) bool: groups whose scorable rewards are not all equal.

    In the other groups q is uniform and the weights barely depend on tau, so they carry no
    signal for the tau controller.
    """
    r = _grouped(rewards, group_size)
    valid = ~torch.isnan(r)
    high = r.masked_fill(~valid, -math.inf).max(dim=-1).values
    low = r.masked_fill(~valid, math.inf).min(dim=-1).values
    return (valid.sum(dim=-1) >= 2) & (high > low)


def weight_stats(
    weights: torch.Tensor, group_size: int, groups: torch.Tensor | None = None
) -> WeightStats | None:
    """Mean over groups (those selected by the (G,) bool `groups`, if given) that have weight;
    None when there is no such group."""
    w = _grouped(weights.double(), group_size)
    live = w.sum(dim=-1) > 0
    if groups is not None:
        live = live & groups.to(live.device)
    if not bool(live.any()):
        return None
    w = w[live]
    entropy = -torch.where(w > 0, w * w.log(), torch.zeros_like(w)).sum(dim=-1)
    ess = 1.0 / (w * w).sum(dim=-1)
    return WeightStats(
        entropy=entropy.mean().item(),
        ess=ess.mean().item(),
        max_weight=w.max(dim=-1).values.mean().item(),
    )


def weighted_policy_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    coefficients: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    importance_sampling_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-completion loss, shape (B,): value -c_i * mean_t log pi(y_i,t) (the weighted negative
    log-likelihood), gradient that of the clipped surrogate -c_i * mean_t min(rho_t, clip(rho_t)).

    rho_t = pi_theta / pi_old per token, clipped to [1 - epsilon_low, 1 + epsilon_high] as in
    GRPO/PPO; coefficients c_i are the (detached) weights, scaled by the caller. On-policy
    (rho = 1) the gradient is -c_i * mean_t grad log pi(y_i,t), the gradient of the value.
    importance_sampling_ratio: TRL's vLLM sampling correction, multiplied in per token.
    """
    coef = coefficients.detach().unsqueeze(-1)
    ratio = torch.exp(per_token_logps - old_per_token_logps)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    surrogate = torch.min(ratio * coef, clipped * coef)
    # The surrogate's value is ~c on-policy, which says nothing; log the objective instead.
    per_token = -(coef * per_token_logps.detach() + surrogate - surrogate.detach())
    if importance_sampling_ratio is not None:
        per_token = per_token * importance_sampling_ratio
    mask = mask.to(per_token.dtype)
    return (per_token * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)
