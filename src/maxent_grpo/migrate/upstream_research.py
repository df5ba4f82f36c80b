"""Upstream MaxEnt-GRPO's research keys (its paper runs: pass@8 evaluation, OAT parity, rich
completion logs) and its top-k spellings, each mapped or left out with what then differs.

top_k: upstream wrote vLLM's "off", -1 (gen_top_k, vllm_top_k); TRL 1.16 spells it 0 (its
GRPOConfig: 0 disables top-k; vLLM's SamplingParams reads 0 and -1 alike), so -1 becomes 0.
"""

from __future__ import annotations

from typing import Any

from maxent_grpo.migrate.kinds import Rows

UP = Rows("upstream maxent-grpo")


def top_k(value: Any) -> int:
    """upstream's top-k -> TRL's: -1 or null (off) is 0, a positive number stays."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not a whole number")
    return 0 if value < 0 else value


def _true(value: Any) -> bool:
    return value is True


_PASS_AT_8 = (
    "upstream's pass@8 evaluation in its own harness; here a benchmark scores pass@k of each "
    "saved checkpoint: benchmarks: [{name, dataset, num_samples: 8, k: 8, temperature}] "
    "(docs/evaluation.md)"
)

ROWS = (
    UP.convert("gen_top_k", to="top_k", by=top_k, why="TRL's top-k; -1 (off) is 0 in TRL 1.16"),
    UP.convert("vllm_top_k", to="top_k", by=top_k, why="TRL's top-k; -1 (off) is 0 in TRL 1.16"),
    UP.remove("seed_paper_eval_pass_at_8_enabled", why=_PASS_AT_8, changes=_true),
    *(
        UP.remove(f"seed_paper_eval_pass_at_8_{part}", why=_PASS_AT_8)
        for part in ("samples", "temperature", "top_p")
    ),
    UP.remove(
        "vllm_include_stop_str_in_output",
        why="upstream kept the stop string in the completion; TRL's vLLM requests leave it out, "
        "so rewards see the completion without it",
        changes=_true,
    ),
    UP.remove(
        "zero_truncated_completion_rewards",
        why="upstream scored a truncated completion 0; here it keeps its reward (with "
        "mask_truncated_completions: true it is left out of the loss instead)",
        changes=_true,
    ),
    UP.remove("rich_log_completions", why="upstream's completion logs; TRL logs completions"),
    UP.remove("seed_paper_reward_fast", why="a speed knob of upstream's reward code"),
)
