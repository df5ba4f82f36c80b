"""The trainer's components and their one order.

A component is a plain class: built with the trainer and the components it works with
(`needs`, earlier in the list), it implements some of the hooks of train/trl_adapter.py
`HOOKS` as `method(call, *args)`, where `call` is the rest of the chain (the next component
that implements the hook, TRL's last), and registers its own state (train/state.py). For each
hook the components run in the order of `plan_components`, the first outermost: what it does
before `call` comes first, what it does after comes last. `hook_order` reads that order.
Importing this module imports torch and TRL (the components' modules).
"""

from __future__ import annotations

from maxent_grpo.faults import failpoint
from maxent_grpo.methods import rollouts_on, uses_vllm_server
from maxent_grpo.train.adaptive_kl import AdaptiveKL
from maxent_grpo.train.async_generation import AsyncGeneration
from maxent_grpo.train.checkpoints import CompleteCheckpoints
from maxent_grpo.train.data_order import EpochOrder
from maxent_grpo.train.entropy_kl import EntropyKL, rule_of
from maxent_grpo.train.heartbeat import Beats
from maxent_grpo.train.replay import Replay
from maxent_grpo.train.rollout_rounds import Rollouts
from maxent_grpo.train.step_time import StepClock
from maxent_grpo.train.trl_adapter import HOOKS
from maxent_grpo.train.vllm_sync import VLLMSync


class Failpoints:
    """Component, every RL trainer, outermost: the fault-injection points of each generation
    and of each scoring (faults.py; inert unless MAXENT_GRPO_FAILPOINT names them)."""

    name = "failpoints"
    needs = ()

    def __init__(self, trainer):
        self.trainer = trainer

    def generate_and_score(self, call, inputs):
        failpoint("generation", self.trainer.state.global_step + 1)
        return call(inputs)

    def rewards(self, call, *args):
        failpoint("scoring", self.trainer.state.global_step + 1)
        return call(*args)


def plan_components(args, method: str, method_component: type | None = None) -> list[type]:
    """The component classes a recipe turns on, in their order (the order of every hook).

    Why this order: the failpoints and the heartbeat come before everything; the adaptive
    beta reads TRL's KL after the loss the entropy rule adapted; a checkpoint is marked
    complete only after every file, the rounds' state included; the rounds call the scoring
    below them once per round (each round gets MaxEnt's weights, timed as rewards by the
    step clock); replay (never with the rounds: recipe check) wraps the scoring of the
    step's fresh groups, so it stores them with MaxEnt's weights as their advantages and the
    step clock times their rewards; the step clock times the async request as input
    preparation; MaxEnt, innermost, computes its weights and loss on TRL's own output.
    """
    if method == "sft":
        return [Beats, CompleteCheckpoints]
    plan: list[type] = [Failpoints, Beats]
    if method == "grpo":
        if args.kl_target is not None:
            plan.append(AdaptiveKL)
        if rule_of(args) is not None or args.entropy_normalize_by_max:
            plan.append(EntropyKL)
    plan.append(CompleteCheckpoints)
    if rollouts_on(args):
        plan.append(Rollouts)
    if args.replay_share > 0:
        plan.append(Replay)
    plan += [EpochOrder, StepClock]
    if args.use_vllm:
        plan.append(VLLMSync)
    if args.async_generation and uses_vllm_server(args):
        plan.append(AsyncGeneration)
    if method_component is not None:
        plan.append(method_component)
    return plan


def build_components(trainer, plan: list[type]) -> list:
    """Each component of `plan`, built in order with the trainer and the ones it needs."""
    built: dict[str, object] = {}
    for cls in plan:
        built[cls.name] = cls(trainer, **{need: built.get(need) for need in cls.needs})
    return list(built.values())


def hook_order(plan: list[type]) -> dict[str, list[str]]:
    """TRL hook -> the names of the components that implement it, outermost first."""
    order = {
        hook: [cls.name for cls in plan if getattr(cls, method, None) is not None]
        for hook, method in HOOKS.items()
    }
    return {hook: names for hook, names in order.items() if names}
