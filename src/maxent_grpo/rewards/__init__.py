"""Reward functions for GRPO training, and the registry that resolves them by name.

Every reward is a plain callable following TRL's convention::

    reward(completions, **kwargs) -> list[float | None]

``completions`` holds either strings or conversational message lists
(``[{"role": "assistant", "content": "..."}]``, in which case the content of the
last message is scored). The reference answer arrives as the ``solution`` keyword
(one entry per completion; TRL forwards every dataset column as a keyword).
Any other keyword TRL passes (``prompts``, ``completion_ids``, ``trainer_state``,
``log_extra``, ``log_metric``, dataset columns) is accepted and ignored unless a
reward documents that it uses it. ``None`` means "no reward for this sample"; TRL
turns it into NaN and leaves it out of the weighted sum.

Rewards are resolved with :func:`get_reward_funcs`, either by registry name
(see :func:`list_reward_names`) or as ``module:function`` for a custom callable.

Modules: ``builtin`` (the text rewards), ``answers`` (finding and verifying math answers),
``code`` and ``sandbox`` (rewards that run the completion's program, locally), ``registry``
(names, settings, ``module:function``), ``guard`` (the failure policy used in training).
"""

from maxent_grpo.rewards.common import (
    RewardError,
    RewardFunc,
)
from maxent_grpo.rewards.guard import (
    GuardedReward,
    RewardTimeout,
    guard_rewards,
)
from maxent_grpo.rewards.registry import (
    REWARD_SETTINGS,
    get_reward_funcs,
    list_reward_names,
)

__all__ = [
    "REWARD_SETTINGS",
    "get_reward_funcs",
    "guard_rewards",
    "GuardedReward",
    "list_reward_names",
    "RepetitionPenalty",
    "RewardError",
    "RewardFunc",
    "RewardTimeout",
    "SoftOverlongPunishment",
]


def __getattr__(name: str):
    # The text rewards' classes load on first use (math-verify and sympy: about 0.5 s).
    if name in ("RepetitionPenalty", "SoftOverlongPunishment"):
        from maxent_grpo.rewards import builtin  # deferred: sympy, on first use

        return getattr(builtin, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
