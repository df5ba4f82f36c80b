"""An entropy bonus whose coefficient follows the KL to the reference (upstream MaxEnt-GRPO's).

TRL adds `-entropy_coef * H` to the GRPO loss (H: mean per-token entropy of the micro-batch)
and reads `self.entropy_coef` at every loss. Upstream MaxEnt-GRPO (liv-daliberti/maxent-grpo,
`_resolve_effective_maxent_alpha`) scaled its bonus by a multiplier of the KL(policy ||
reference) measured on the same micro-batch, before that micro-batch's loss:

    KL < threshold, below = raise:  m = 1 + gain * (threshold - KL) / threshold
    KL > threshold, above = off:    m = 0   (outside the trust zone; not clamped)
    KL > threshold, above = lower:  m = 1 / (1 + gain * (KL - threshold) / threshold)
    otherwise:                      m = 1
    m clamped to [min_multiplier, max_multiplier] (except 0 above); a non-finite KL gives
    0 (off), min_multiplier (lower) or 1.

and, with `entropy_normalize_by_max`, divided the entropy by ln(vocabulary size). Here the
coefficient TRL applies is `entropy_coef * m / scale`, set per micro-batch. The KL is the one
TRL computes for its penalty (k3 estimate, mean over the micro-batch's completion tokens
outside tool output, averaged over processes), so beta must be > 0. The rule reads only the
micro-batch in hand: nothing carries over between steps, so nothing is registered.

Hooks (train/components.py): `_compute_loss` (wrapped: the inputs are kept for the next) and
`_get_per_token_logps_and_entropies` (after TRL's, inside `_compute_loss` only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from maxent_grpo.train import trl_adapter


@dataclass(frozen=True)
class EntropyKLRule:
    threshold: float
    below: str = "keep"  # keep | raise
    above: str = "keep"  # keep | lower | off
    gain: float = 1.0
    min_multiplier: float = 0.5
    max_multiplier: float = 2.0

    def multiplier(self, kl: float) -> float:
        """The factor on entropy_coef for a micro-batch whose KL to the reference is `kl`."""
        if not math.isfinite(kl):
            return {"off": 0.0, "lower": self.min_multiplier}.get(self.above, 1.0)
        t = self.threshold
        if kl < t and self.below == "raise":
            m = 1.0 + self.gain * (t - kl) / t
        elif kl > t and self.above == "off":
            return 0.0
        elif kl > t and self.above == "lower":
            m = 1.0 / (1.0 + self.gain * (kl - t) / t)
        else:
            m = 1.0
        return min(max(m, self.min_multiplier), self.max_multiplier)


def rule_of(args) -> EntropyKLRule | None:
    """The recipe's rule (GRPOConfig's `entropy_kl_*` keys); None without entropy_kl_threshold."""
    if args.entropy_kl_threshold is None:
        return None
    return EntropyKLRule(
        threshold=args.entropy_kl_threshold,
        below=args.entropy_kl_below,
        above=args.entropy_kl_above,
        gain=args.entropy_kl_gain,
        min_multiplier=args.entropy_kl_min_multiplier,
        max_multiplier=args.entropy_kl_max_multiplier,
    )


def vocabulary_size(model, tokenizer) -> int:
    """Token ids the policy can emit and the tokenizer can read (upstream's entropy scale)."""
    sizes = [model.config.get_text_config().vocab_size, len(tokenizer)]
    return min(s for s in sizes if s and s > 1)


class EntropyKL:
    """Component (train/components.py), on with entropy_kl_threshold or
    entropy_normalize_by_max: the entropy_coef TRL applies, per micro-batch."""

    name = "entropy_kl"
    needs = ()

    def __init__(self, trainer):
        self.trainer = trainer
        self._rule = rule_of(trainer.args)
        self._base = trainer.entropy_coef
        self._scale = 1.0
        if trainer.args.entropy_normalize_by_max:
            self._scale = math.log(vocabulary_size(trainer.model, trainer.processing_class))
            trainer.entropy_coef = self._base / self._scale
        self._inputs = None  # the inputs of the loss being computed

    def loss(self, call, model, inputs):
        self._inputs = inputs if self._rule and self.trainer.model.training else None
        try:
            return call(model, inputs)
        finally:
            self._inputs = None

    def logps_and_entropies(self, call, *args, **kwargs):
        out = call(*args, **kwargs)
        inputs = self._inputs
        if inputs is not None and kwargs.get("compute_entropy"):
            self._inputs = None  # once per loss
            kl = self._micro_batch_kl(out[0], inputs)
            factor = self._rule.multiplier(kl)
            self.trainer.entropy_coef = self._base * factor / self._scale
            metrics = trl_adapter.metrics(self.trainer)
            metrics["entropy_kl/kl"].append(kl)
            metrics["entropy_kl/multiplier"].append(factor)
        return out

    def _micro_batch_kl(self, per_token_logps: torch.Tensor, inputs) -> float:
        """TRL's KL estimate of the loss about to be computed, averaged over processes."""
        with torch.no_grad():
            delta = inputs["ref_per_token_logps"] - per_token_logps
            per_token_kl = torch.exp(delta) - delta - 1
            mask = inputs["completion_mask"]  # the policy's tokens: tool output is not
            if "tool_mask" in inputs:
                mask = mask * inputs["tool_mask"]
            kl = (per_token_kl * mask).sum() / mask.sum().clamp(min=1.0)
            return self.trainer.accelerator.gather(kl.float()).mean().item()
