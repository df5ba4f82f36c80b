"""Replay (`replay_share` > 0): a bounded buffer of trained groups, a share of each
generation drawn from it by priority (docs/replay.md).

The Replay component (train/components.py), hook `_generate_and_score_completions` (train
mode only): of a generation batch of `need` groups, `floor(replay_share x need)` come from the
buffer and only the first `need - replayed` prompts are generated and scored (the skipped
prompts are not trained on in this pass over the data). The step then trains on the fresh
groups and the replayed ones as one batch; TRL shuffles and splits it as usual. The fresh
groups enter the buffer afterwards: with their rewards, advantages and the policy version (the
optimizer steps done) that made them. Groups older than `replay_max_age` steps are evicted
before a draw, the oldest when the buffer is over `replay_buffer_size` (both counted).

The importance correction: a replayed group is off-policy. It carries the per-token logprobs
of the policy that made it (`old_per_token_logps`; computed here in one forward pass when TRL
did not, i.e. when generation and optimizer steps are aligned and no vLLM correction is on), so
TRL's loss takes the ratio pi_now / pi_then and clips it at 1 +- epsilon as for any old sample;
with vLLM, its own `importance_sampling_ratio` (pi_then / the sampler's) and sampling logprobs
travel with it, so the whole correction is pi_now / sampler. Its advantages are those of its
group when it was scored (GRPO's are relative within the group, which has not changed).

The buffer is registered trainer state (`replay`, per process: train/state.py); a draw is
seeded by (seed, step, process), so a resumed run replays what an uninterrupted one would.
Importing this imports torch.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass

import torch

from maxent_grpo.train import trl_adapter
from maxent_grpo.train.group_batches import merge_groups, text_tokenizer
from maxent_grpo.train.state import state_registry

logger = logging.getLogger(__name__)


# ---- the decisions, without TRL -------------------------------------------------------------


def group_priority(kind: str, rewards: list[float], advantages: torch.Tensor) -> float:
    """A group's priority: 'advantage' mean absolute advantage, 'spread' best minus worst reward,
    'reward' mean reward (NaN rewards, unscorable completions, left out)."""
    if kind == "advantage":
        return float(advantages.abs().mean())
    scored = [r for r in rewards if r == r]
    if not scored:
        return 0.0 if kind == "spread" else -math.inf
    if kind == "spread":
        return max(scored) - min(scored)
    return sum(scored) / len(scored)


def draw(priorities: list[float], count: int, rng: random.Random) -> list[int]:
    """`count` indices, without replacement, the higher priority more often: by rank, weight
    1 / rank (rank-based prioritized replay: the scale of rewards does not matter)."""
    order = sorted(range(len(priorities)), key=lambda i: -priorities[i])
    # Efraimidis-Spirakis: the `count` largest u ** (1 / weight) are a weighted draw.
    keys = {i: rng.random() ** (rank + 1) for rank, i in enumerate(order)}
    return sorted(keys, key=lambda i: -keys[i])[:count]


@dataclass
class Buffered:
    """One trained group: its batch rows (on CPU), rewards, priority and the policy version
    (optimizer steps done) that generated it."""

    tensors: dict
    rewards: list[float]
    priority: float
    step: int


class ReplayBuffer:
    """The groups kept for replay, oldest first; at most `size`."""

    def __init__(self, size: int, max_age: int, kind: str):
        self.size, self.max_age, self.kind = size, max_age, kind
        self.groups: list[Buffered] = []

    def evict_old(self, now: int) -> int:
        """Drop the groups more than max_age steps behind `now`; how many."""
        kept = [g for g in self.groups if now - g.step <= self.max_age]
        evicted, self.groups = len(self.groups) - len(kept), kept
        return evicted

    def eligible(self) -> list[int]:
        """Indices of groups that may be replayed (a signal-less group never is, unless the
        priority is the reward)."""
        return [i for i, g in enumerate(self.groups) if self.kind == "reward" or g.priority > 1e-6]

    def sample(self, count: int, rng: random.Random) -> list[Buffered]:
        eligible = self.eligible()
        chosen = draw([self.groups[i].priority for i in eligible], count, rng)
        return [self.groups[eligible[i]] for i in chosen]

    def add(self, groups: list[Buffered]) -> int:
        """Add `groups`; drop the oldest beyond `size`; how many were dropped."""
        self.groups.extend(groups)
        over = max(len(self.groups) - self.size, 0)
        del self.groups[:over]
        return over

    def state_dict(self) -> dict:
        return {
            "groups": [
                {
                    "tensors": {k: t.cpu() for k, t in g.tensors.items()},
                    "rewards": list(g.rewards),
                    "priority": g.priority,
                    "step": g.step,
                }
                for g in self.groups
            ]
        }

    def load_state_dict(self, state: dict) -> None:
        self.groups = [
            Buffered(dict(g["tensors"]), list(g["rewards"]), float(g["priority"]), int(g["step"]))
            for g in state["groups"]
        ]


# ---- the component --------------------------------------------------------------------------


class Replay:
    """Component: the replay buffer (replay_share > 0)."""

    name = "replay"
    needs = ()

    def __init__(self, trainer):
        self.trainer = trainer
        args = trainer.args
        self.buffer = ReplayBuffer(
            args.replay_buffer_size, args.replay_max_age, args.replay_priority
        )
        self._rewards = None
        state_registry(trainer).register(
            "replay", self.buffer.state_dict, self._load, per_process=True
        )

    def rewards(self, call, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = call(inputs, prompts, completions, completion_ids_list)
        self._rewards = rewards_per_func  # every process's rows: sliced in _local_rewards
        return rewards_per_func

    def generate_and_score(self, call, inputs):
        trainer = self.trainer
        if not trainer.model.training:
            return call(inputs)
        k, now = trainer.num_generations, trainer.state.global_step
        need = len(inputs) // k
        evicted_age = self.buffer.evict_old(now)
        wanted = math.floor(trainer.args.replay_share * need)
        count = self._min_over_processes(min(wanted, len(self.buffer.eligible())))
        fresh_rows = inputs[: (need - count) * k]
        output = call(fresh_rows)
        self._ensure_old_logps(output)
        fresh = self._fresh_groups(output, len(fresh_rows), now)
        rank = trainer.accelerator.process_index
        rng = random.Random(f"{trainer.args.seed}-{now}-{rank}")
        replayed = self.buffer.sample(count, rng)
        device = output["completion_ids"].device
        parts = [g.tensors for g in fresh] + [
            {key: t.to(device) for key, t in g.tensors.items()} for g in replayed
        ]
        batch = merge_groups(parts, text_tokenizer(trainer).pad_token_id)
        mask = batch["completion_mask"]
        if "tool_mask" in batch:
            mask = mask * batch["tool_mask"]
        batch["num_items_in_batch"] = trainer.accelerator.gather(mask.sum()).sum()
        evicted_full = self.buffer.add([self._to_cpu(g) for g in fresh])
        self._log(need, replayed, now, evicted_age, evicted_full)
        return batch

    # ---- the pieces of a step ---------------------------------------------------------------

    def _ensure_old_logps(self, output: dict) -> None:
        """The logprobs of the policy that made the fresh groups (the one training now): what a
        group carries into the buffer, for its importance ratio when it is replayed."""
        if "old_per_token_logps" in output:
            return
        trainer = self.trainer
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        with torch.no_grad():
            logps, _, _ = trl_adapter.per_token_logps_and_entropies(
                trainer,
                trainer.model,
                ids,
                mask,
                output["completion_ids"].size(1),
                batch_size=trainer.args.per_device_train_batch_size,
            )
        output["old_per_token_logps"] = logps

    def _fresh_groups(self, output: dict, n: int, now: int) -> list[Buffered]:
        """The step's `n` generated rows, cut into groups, each with its rewards and priority."""
        k, rows, rewards = self.trainer.num_generations, _rows(output, n), self._local_rewards(n)
        groups = []
        for g in range(n // k):
            tensors = {key: value[g * k : (g + 1) * k] for key, value in rows.items()}
            group_rewards = rewards[g * k : (g + 1) * k]
            priority = group_priority(self.buffer.kind, group_rewards, tensors["advantages"])
            groups.append(Buffered(tensors, group_rewards, priority, now))
        return groups

    def _local_rewards(self, n: int) -> list[float]:
        """This process's `n` rows of the weighted rewards TRL just computed (NaN: unscored)."""
        trainer = self.trainer
        per_func, self._rewards = self._rewards, None
        start = trainer.accelerator.process_index * n
        local = per_func[start : start + n]
        weights = trainer.reward_weights.to(local.device).unsqueeze(0)
        rewards = (local * weights).nansum(dim=1)
        rewards[torch.isnan(local).all(dim=1)] = torch.nan
        return rewards.tolist()

    @staticmethod
    def _to_cpu(group: Buffered) -> Buffered:
        # A copy even on CPU: a slice would keep the whole step's batch alive.
        tensors = {key: t.detach().to("cpu", copy=True) for key, t in group.tensors.items()}
        return Buffered(tensors, group.rewards, group.priority, group.step)

    def _min_over_processes(self, value: int) -> int:
        """The fewest any process can replay: every process generates the same rows (TRL
        gathers them)."""
        accelerator = self.trainer.accelerator
        if accelerator.num_processes == 1:
            return int(value)
        local = torch.tensor([value], device=accelerator.device)
        return int(accelerator.gather(local).min().item())

    def _log(self, need: int, replayed: list[Buffered], now: int, age: int, full: int) -> None:
        accelerator = self.trainer.accelerator
        ages = [now - g.step for g in replayed]
        local = [len(replayed), need, sum(ages), age, full, len(self.buffer.groups)]
        if accelerator.num_processes > 1:
            sums = accelerator.reduce(
                torch.tensor(local, dtype=torch.float64, device=accelerator.device), "sum"
            ).tolist()
        else:
            sums = [float(v) for v in local]
        count, groups, age_sum, evicted_age, evicted_full, held = sums
        metrics = trl_adapter.metrics(self.trainer)
        metrics["replay/share"].append(count / max(groups, 1))
        metrics["replay/groups"].append(count)
        metrics["replay/mean_age"].append(age_sum / count if count else 0.0)
        metrics["replay/evicted_age"].append(evicted_age)
        metrics["replay/evicted_full"].append(evicted_full)
        metrics["replay/buffer"].append(held)

    def _load(self, state: dict) -> None:
        self.buffer.load_state_dict(state)
        logger.warning("replay: resumed a buffer of %d groups", len(self.buffer.groups))


def _rows(output: dict, n: int) -> dict:
    """The per-row keys of TRL's output (all but num_items_in_batch)."""
    rows = {}
    for key, value in output.items():
        if key == "num_items_in_batch":
            continue
        if not (isinstance(value, torch.Tensor) and value.ndim >= 1 and len(value) == n):
            raise RuntimeError(f"replay: cannot keep the batch key {key!r} per group")
        rows[key] = value
    return rows
