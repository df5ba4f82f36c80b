"""Scores from rewards: pass@k with the unbiased estimator, over the problems of a benchmark.

Pure functions over numbers: the rewards of each problem's samples in, one score out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate of one problem with n samples, c of them correct:
    1 - C(n-c, k) / C(n, k) (Chen et al. 2021), the chance that k of the n samples drawn
    without replacement hold at least one correct one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass(frozen=True)
class Score:
    """A benchmark's score: the mean pass@k over the problems scored."""

    score: float | None  # None: no problem could be scored
    problems: int  # problems scored
    unscored: int  # problems whose every sample's reward was None (e.g. unparsable answer)
    mean_reward: float | None  # mean reward over every sample with one


def score_rewards(
    rewards: Sequence[Sequence[float | None]], k: int, threshold: float = 1.0
) -> Score:
    """rewards[i]: the rewards of problem i's samples. A sample passes when its reward is
    >= threshold; a None reward fails, and a problem with only None rewards is left out."""
    per_problem, unscored, total, count = [], 0, 0.0, 0
    for samples in rewards:
        known = [r for r in samples if r is not None]
        total, count = total + sum(known), count + len(known)
        if not known:
            unscored += 1
            continue
        correct = sum(1 for r in known if r >= threshold)
        per_problem.append(pass_at_k(len(samples), correct, k))
    score = sum(per_problem) / len(per_problem) if per_problem else None
    return Score(score, len(per_problem), unscored, total / count if count else None)
