"""Upstream's reward names, each with the built-in that scores the same way here.

open-r1's judged rewards (ioi_code, cf_code) are the reward registry's (rewards/code.py
JUDGED_REWARDS): it refuses them by name, and migrate reads the same reasons.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RewardRename:
    """An upstream reward name and the built-in that scores the same way here."""

    name: str
    builtin: str
    why: str
    changes: bool  # True: the built-in scores differently (migrate's summary lists it)


#: Upstream's reward names (its rewards/basic.py), each with the built-in migrate writes.
UPSTREAM_REWARDS = {
    r.name: r
    for r in (
        RewardRename(
            "pure_accuracy_math",
            "answer_match",
            "upstream scored 1.0 for a canonicalized exact match of the <answer> block inside "
            "an exact <think>/<answer> layout (older versions: partial credit for tags); "
            "answer_match scores the exact match of the last <answer> block, any layout",
            True,
        ),
        RewardRename(
            "seed_paper_boxed_accuracy_math",
            "boxed_accuracy_math",
            "the last \\boxed{} answer graded for mathematical equivalence (math-verify), as "
            "the SEED paper's grader",
            False,
        ),
        RewardRename(
            "seed_paper_answer_tag_accuracy_math",
            "accuracy",
            "the <answer> block graded for mathematical equivalence (math-verify)",
            False,
        ),
        RewardRename(
            "missing_boxed_answer_penalty_math",
            "boxed_missing_penalty",
            "a penalty for a completion without \\boxed{}; its weight is scaled by "
            "missing_boxed_answer_penalty (default -0.05) since boxed_missing_penalty gives -1",
            False,
        ),
        RewardRename(
            "mbpp_python_tests",
            "python_unit_tests",
            "the program run with the row's tests (dataset_answer_column) in the sandbox",
            False,
        ),
    )
}

#: missing_boxed_answer_penalty when the recipe does not set it (upstream's default).
UPSTREAM_BOXED_PENALTY = -0.05
