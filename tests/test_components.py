"""The trainer's components and their one order (train/components.py, train/trl_adapter.py).

The hook order is what the trainers' behaviour depends on (each round gets MaxEnt's weights,
the async request is timed as input preparation, a checkpoint is marked after the rounds'
state is written, ...): these tables pin it for each kind of recipe, so swapping two
components in `plan_components` fails here. Fast: no model, no training.
"""

from __future__ import annotations

import inspect

import pytest

from maxent_grpo.maxent.trainer import MaxEnt, MaxEntGRPOTrainer
from maxent_grpo.recipe.keys import GRPOConfig
from maxent_grpo.recipe.maxent_keys import MaxEntConfig
from maxent_grpo.train.components import hook_order, plan_components
from maxent_grpo.train.grpo_trainer import GRPOTrainer
from maxent_grpo.train.sft_trainer import SFTTrainer
from maxent_grpo.train.trl_adapter import HOOKS, HookedTrainer

BASE = dict(output_dir="/tmp/x", use_cpu=True, bf16=False, report_to=[])
SERVER = dict(use_vllm=True, vllm_mode="server", vllm_weight_sync="disk")
ROUNDS = dict(rollout_filters=["nonzero_std"], max_generation_rounds=2)

# Every recipe's: failpoints and heartbeat outermost, the checkpoints, data order, step clock.
GRPO = {
    "_generate_and_score_completions": ["failpoints"],
    "_get_train_sampler": ["data_order"],
    "training_step": ["step_clock"],
    "_prepare_inputs": ["step_clock"],
    "_generate": ["heartbeat", "step_clock"],
    "_calculate_rewards": ["failpoints", "step_clock"],
    "_save_checkpoint": ["heartbeat", "checkpoints"],
    "_save_optimizer_and_scheduler": ["checkpoints"],
    "_load_optimizer_and_scheduler": ["checkpoints"],
}
MAXENT = {
    **GRPO,
    "_calculate_rewards": ["failpoints", "step_clock", "maxent"],  # keeps what the clock timed
    "_generate_and_score_completions": ["failpoints", "maxent"],
    "_compute_loss": ["maxent"],
}
ASYNC = {
    **GRPO,
    "get_batch_samples": ["async_generation"],
    "_prepare_inputs": ["step_clock", "async_generation"],  # the request is input preparation
    "_generate_single_turn": ["async_generation"],
}
ROUNDS_HOOKS = {
    "_generate_and_score_completions": ["failpoints", "rollouts"],
    "_calculate_rewards": ["failpoints", "rollouts", "step_clock"],  # each round's, timed
    "compute_loss": ["rollouts"],
}
REPLAY = dict(replay_share=0.5, num_generations=4)  # 2 groups a process: 1 replayed
REPLAY_HOOKS = {
    "_generate_and_score_completions": ["failpoints", "replay"],
    "_calculate_rewards": ["failpoints", "replay", "step_clock"],  # timed: TRL's own
}
CASES = {
    "grpo": ({}, "grpo", None, GRPO),
    "grpo, adaptive beta and entropy rule": (
        dict(beta=0.04, kl_target=0.1, kl_horizon=100, entropy_coef=0.1),
        "grpo",
        None,
        {**GRPO, "_compute_loss": ["adaptive_kl"]},
    ),
    "grpo, entropy rule": (
        dict(beta=0.04, entropy_coef=0.1, entropy_kl_threshold=0.05, entropy_kl_below="raise"),
        "grpo",
        None,
        {
            **GRPO,
            "_compute_loss": ["entropy_kl"],
            "_get_per_token_logps_and_entropies": ["entropy_kl"],
        },
    ),
    "maxent": ({}, "maxent", MaxEnt, MAXENT),
    "async": ({**SERVER, "async_generation": True}, "grpo", None, ASYNC),
    "rounds and filters": (ROUNDS, "grpo", None, {**GRPO, **ROUNDS_HOOKS}),
    "maxent, rounds and async": (
        {**SERVER, **ROUNDS, "async_generation": True},
        "maxent",
        MaxEnt,
        {
            **ASYNC,
            **ROUNDS_HOOKS,
            "_calculate_rewards": ["failpoints", "rollouts", "step_clock", "maxent"],
            "_generate_and_score_completions": ["failpoints", "rollouts", "maxent"],  # each round
            "_compute_loss": ["maxent"],
        },
    ),
    # Replay wraps the scoring of the fresh groups: it keeps them with MaxEnt's weights.
    "replay": (REPLAY, "grpo", None, {**GRPO, **REPLAY_HOOKS}),
    "maxent and replay": (
        REPLAY,
        "maxent",
        MaxEnt,
        {
            **MAXENT,
            "_generate_and_score_completions": ["failpoints", "replay", "maxent"],
            "_calculate_rewards": ["failpoints", "replay", "step_clock", "maxent"],
        },
    ),
    "lora sync": ({**SERVER, "vllm_weight_sync": "lora"}, "grpo", None, GRPO),
    "tools": ({"max_tool_calling_iterations": 3}, "grpo", None, GRPO),  # TRL runs the loop
}


def config(method: str, keys: dict):
    return (MaxEntConfig if method == "maxent" else GRPOConfig)(**BASE, **keys)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_hook_calls_its_components_in_the_one_order(case):
    keys, method, own, expected = CASES[case]
    assert hook_order(plan_components(config(method, keys), method, own)) == expected


def test_which_components_a_recipe_turns_on():
    names = lambda keys, method="grpo", own=None: [  # noqa: E731
        cls.name for cls in plan_components(config(method, keys), method, own)
    ]
    assert names({}) == ["failpoints", "heartbeat", "checkpoints", "data_order", "step_clock"]
    # LoRA sync: the VLLMSync component times it; the backend is chosen before TRL's __init__.
    assert names({**SERVER, "vllm_weight_sync": "lora"})[-1] == "vllm_sync"
    # vllm_sync is built before the async component, which takes the servers' version from it.
    assert names({**SERVER, "async_generation": True})[-2:] == ["vllm_sync", "async_generation"]
    assert names({}, "maxent", MaxEnt)[-1] == "maxent"
    assert [c.name for c in plan_components(None, "sft")] == ["heartbeat", "checkpoints"]


@pytest.mark.parametrize("trainer", [GRPOTrainer, MaxEntGRPOTrainer, SFTTrainer])
def test_each_trainer_is_one_class_of_ours_over_trls(trainer):
    ours = [cls for cls in trainer.__mro__ if cls.__module__.startswith("maxent_grpo.")]
    assert ours == [trainer, HookedTrainer]
    # No TRL method is defined twice: the trainer class itself only names its method.
    assert not [name for name, value in vars(trainer).items() if inspect.isfunction(value)]
    overridden = {name for name in vars(HookedTrainer) if name in HOOKS}
    assert overridden == set(HOOKS)
