"""Rollout filters, generation rounds and carry-over in TRL's GRPOTrainer (and MaxEnt's).

One override, `_generate_and_score_completions` (train mode only): it calls TRL's (or MaxEnt's)
once per round, cuts the output into groups, filters them (train/rollouts.py), and returns the
kept groups as one batch; TRL's `_prepare_inputs` shuffles and splits it as usual. Every process
holds whole groups (recipe check), decides for its own groups, and takes part in every round:
the number of rounds is decided from every process's shortfall (a gather), so no process
generates alone. Carried-over groups and the position in the extra-prompt stream are registered
trainer state (`rollouts`, per process: train/state.py), saved in each checkpoint. Importing
this imports torch and TRL.
"""

from __future__ import annotations

import logging
import random

import torch
import torch.nn.functional as F
from transformers import TrainerCallback

from maxent_grpo.faults import failpoint
from maxent_grpo.rollout_filters import FilterSettings, Group, apply_filters, resolve_filters
from maxent_grpo.train.rollouts import StepTally, round_sizes, usable_groups
from maxent_grpo.train.state import state_registry

logger = logging.getLogger(__name__)

_LEFT_PADDED = {"prompt_ids", "prompt_mask"}
# TRL's metrics of the whole generated batch, replaced by those of the trained groups.
_TRAINED_METRICS = ("reward", "reward_std", "frac_reward_zero_std")


class _SkipOptimizerStep(TrainerCallback):
    """A skipped step leaves the weights alone: no gradients, so the optimizer skips them."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.trainer._rollout_skip:
            for param in self.trainer.model.parameters():
                param.grad = None


class RolloutMixin:
    """Rollout filters, generation rounds and carry-over (docs/rollouts.md), mixed in before
    TRL's or MaxEnt's trainer (each round calls theirs)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.args
        self._rollout_filters = resolve_filters(config.rollout_filters or [])
        self._rollout_settings = FilterSettings(
            min_reward=config.rollout_min_reward,
            min_length=config.rollout_min_length,
            max_length=config.rollout_max_length,
            drop_truncated=config.rollout_drop_truncated,
        )
        self._rollouts_on = bool(self._rollout_filters) or (
            config.max_generation_rounds > 1 or config.oversample_factor > 1.0
        )
        self._carried: list[tuple[dict, list[float]]] = []
        self._reserve_position = 0
        if self._rollouts_on:
            state_registry(self).register(
                "rollouts", self._rollout_state, self._load_rollout_state, per_process=True
            )
        self._reserve_order: tuple[int, list[int]] = (-1, [])
        self._round_capture = None
        self._rollout_skip = False
        if self._rollouts_on:
            self.add_callback(_SkipOptimizerStep(self))

    # ---- one round ------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        failpoint("scoring", self.state.global_step + 1)
        rewards_per_func = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        self._round_capture = (prompts, completions, completion_ids_list, rewards_per_func)
        return rewards_per_func

    def _reserve_rows(self, groups: int) -> list[dict]:
        """This process's share of the next `groups` x processes extra prompts, each repeated
        num_generations times: a seeded order of the dataset, the same on every process."""
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        size = len(self.train_dataset)
        rows = []
        for offset in range(rank * groups, (rank + 1) * groups):
            position = self._reserve_position + offset
            epoch = position // size
            if self._reserve_order[0] != epoch:  # a new pass over the data, a new order
                order = list(range(size))
                random.Random(self.args.seed + 1 + epoch).shuffle(order)
                self._reserve_order = (epoch, order)
            row = self.train_dataset[self._reserve_order[1][position % size]]
            rows.extend(dict(row) for _ in range(self.num_generations))
        self._reserve_position += groups * world
        return rows

    def _score_round(self, rows: list[dict]):
        output = super()._generate_and_score_completions(rows)
        prompts, completions, completion_ids, rewards_per_func = self._round_capture
        self._round_capture = None
        k, n = self.num_generations, len(rows)
        start = self.accelerator.process_index * n
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        local = rewards_per_func[start : start + n]
        rewards = (local * weights).nansum(dim=1)
        rewards[torch.isnan(local).all(dim=1)] = torch.nan
        rewards = rewards.tolist()
        stops = {*self.eos_token_ids, self._tokenizer.pad_token_id}
        groups, views = [], []
        for g in range(n // k):
            rows_g = slice(g * k, (g + 1) * k)
            tensors = {}
            for key, value in output.items():
                if key == "num_items_in_batch":
                    continue
                if not (isinstance(value, torch.Tensor) and value.ndim >= 1 and len(value) == n):
                    raise RuntimeError(f"rollout_filters: cannot regroup the batch key {key!r}")
                tensors[key] = value[rows_g]
            groups.append((tensors, rewards[rows_g]))
            views.append(
                Group(
                    prompts=[_text(p) for p in prompts[rows_g]],
                    completions=[_text(c) for c in completions[rows_g]],
                    rewards=rewards[rows_g],
                    lengths=[len(ids) for ids in completion_ids[rows_g]],
                    truncated=[not ids or ids[-1] not in stops for ids in completion_ids[rows_g]],
                )
            )
        keep, per_filter = apply_filters(views, self._rollout_filters, self._rollout_settings)
        return (
            output,
            [g for g, kept in zip(groups, keep, strict=True) if kept],
            len(groups),
            per_filter,
        )

    def _sum_over_processes(self, values: list[float]) -> list[float]:
        if self.accelerator.num_processes == 1:  # no collective, no device round trip
            return [float(v) for v in values]
        local = torch.tensor(values, dtype=torch.float64, device=self.accelerator.device)
        return self.accelerator.reduce(local, reduction="sum").tolist()

    def _max_over_processes(self, value: int) -> int:
        if self.accelerator.num_processes == 1:
            return int(value)
        local = torch.tensor([value], device=self.accelerator.device)
        return int(self.accelerator.gather(local).max().item())

    # ---- a step's rounds ------------------------------------------------------------------

    def _round_needed(self, need: int, carried: int) -> bool:
        """Another round runs while some process holds fewer groups than it needs (a
        collective: every process asks at the same point)."""
        return self._max_over_processes(need - carried) > 0

    def _round_rows(self, inputs, round_index: int, *, peek: bool = False) -> list[dict]:
        """The rows a round generates for: the step's own prompts and the over-sampled extra
        ones in round 0, extra prompts only later. `peek` reads them without moving the
        extra-prompt stream (async generation sends the next step's first round ahead)."""
        need = len(inputs) // self.num_generations
        first, later = round_sizes(need, self.args.oversample_factor)
        position = self._reserve_position
        if round_index == 0:
            rows = list(inputs) + self._reserve_rows(first - need)
        else:
            rows = self._reserve_rows(later)
        if peek:
            self._reserve_position = position
        return rows

    def _generate_and_score_completions(self, inputs):
        failpoint("generation", self.state.global_step + 1)
        if not (self._rollouts_on and self.model.training):
            return super()._generate_and_score_completions(inputs)
        config, k = self.args, self.num_generations
        need = len(inputs) // k
        metrics = self._metrics["train"]
        marks = {name: len(metrics[name]) for name in _TRAINED_METRICS}
        pool, self._carried = self._carried, []
        tally = StepTally(carried_in=int(self._sum_over_processes([len(pool)])[0]))
        names = list(self._rollout_filters)
        per_filter = dict.fromkeys(names, 0.0)
        last_output, kept_here = None, 0
        while tally.rounds < config.max_generation_rounds:
            if not self._round_needed(need, len(pool)):
                break
            rows = self._round_rows(inputs, tally.rounds)
            last_output, kept, generated, counts = self._score_round(rows)
            pool.extend(kept)
            kept_here += len(kept)
            sums = self._sum_over_processes([generated, len(kept)] + [counts[n] for n in names])
            tally.generated += int(sums[0])
            tally.kept += int(sums[1])
            for name, count in zip(names, sums[2:], strict=True):
                per_filter[name] += count
            tally.rounds += 1

        usable = usable_groups(min(len(pool), need), k, config.steps_per_generation)
        needed_total = int(self._sum_over_processes([need])[0])
        self._rollout_skip = self._max_over_processes(-usable) >= 0  # some process has none
        if self._rollout_skip:
            trained, batch = [], last_output
        else:
            trained = pool[:usable]
            batch = self._merge([tensors for tensors, _ in trained])
        rest = pool[len(trained) :]
        self._carried, dropped = rest[:need], rest[need:]
        counts = self._sum_over_processes([len(trained), len(self._carried), len(dropped)])
        tally.trained, tally.carried_out, tally.dropped = (int(c) for c in counts)
        tally.skipped = self._rollout_skip
        for name, value in tally.metrics(per_filter).items():
            metrics[name].append(value)
        step = self.state.global_step + 1
        if self._rollout_skip:
            logger.warning(
                "rollouts: step %d skipped: a process kept no usable group after %d rounds "
                "(%d of %d groups kept, %d of them by this process; %d carried over, "
                "%d dropped); weights unchanged",
                step,
                tally.rounds,
                tally.kept,
                tally.generated,
                kept_here,
                tally.carried_out,
                tally.dropped,
            )
            return batch
        if tally.trained < needed_total:
            logger.warning(
                "rollouts: step %d trains on %d of %d groups after %d rounds (short by %d)",
                step,
                tally.trained,
                needed_total,
                tally.rounds,
                needed_total - tally.trained,
            )
        self._replace_reward_metrics(marks, [rewards for _, rewards in trained])
        return batch

    def _replace_reward_metrics(self, marks: dict, trained_rewards: list[list[float]]) -> None:
        """TRL's reward, reward_std and frac_reward_zero_std of the groups trained on."""
        metrics = self._metrics["train"]
        flat = [r for rewards in trained_rewards for r in rewards if r == r]
        zero = [float(_spread(rewards) <= 1e-6) * len(rewards) for rewards in trained_rewards]
        total, squares, count, zero_rows, rows = self._sum_over_processes(
            [
                sum(flat),
                sum(r * r for r in flat),
                len(flat),
                sum(zero),
                sum(map(len, trained_rewards)),
            ]
        )
        generated = metrics["reward"][marks["reward"] :]
        if generated:  # the mean reward of everything generated, before the filters
            metrics["rollouts/reward_generated"].append(sum(generated) / len(generated))
        for name, mark in marks.items():
            del metrics[name][mark:]
        mean = total / max(count, 1)
        metrics["reward"].append(mean)
        variance = (squares - count * mean * mean) / max(count - 1, 1)
        metrics["reward_std"].append(max(variance, 0.0) ** 0.5)
        metrics["frac_reward_zero_std"].append(zero_rows / max(rows, 1))

    def _merge(self, groups: list[dict]) -> dict:
        """One batch from groups of different rounds: pad each key to the widest group."""
        pad_token = self._tokenizer.pad_token_id
        batch = {}
        for key in groups[0]:
            parts = [g[key] for g in groups]
            if parts[0].ndim == 2:
                width = max(p.size(1) for p in parts)
                value = (
                    pad_token
                    if key in ("prompt_ids", "completion_ids")
                    else (1 if key == "tool_mask" else 0)
                )
                parts = [
                    F.pad(
                        p,
                        (width - p.size(1), 0) if key in _LEFT_PADDED else (0, width - p.size(1)),
                        value=value,
                    )
                    for p in parts
                ]
            batch[key] = torch.cat(parts)
        mask = batch["completion_mask"]
        if "tool_mask" in batch:
            mask = mask * batch["tool_mask"]
        batch["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        return batch

    # ---- a skipped step -------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        # A skipped step still runs forward and backward (every process, in step), with no effect.
        return loss * 0.0 if self._rollout_skip else loss

    # ---- checkpoints ----------------------------------------------------------------------

    def _rollout_state(self) -> dict:
        return {
            "reserve_position": self._reserve_position,
            "carried": [
                ({key: t.cpu() for key, t in tensors.items()}, rewards)
                for tensors, rewards in self._carried
            ],
        }

    def _load_rollout_state(self, state: dict) -> None:
        device = self.accelerator.device
        self._reserve_position = int(state["reserve_position"])
        self._carried = [
            ({key: t.to(device) for key, t in tensors.items()}, list(rewards))
            for tensors, rewards in state["carried"]
        ]
        logger.warning(
            "rollouts: resumed %d carried groups, extra-prompt position %d",
            len(self._carried),
            self._reserve_position,
        )


def _spread(rewards: list[float]) -> float:
    scored = [r for r in rewards if r == r]
    return max(scored) - min(scored) if len(scored) >= 2 else 0.0


def _text(value) -> str:
    """A prompt or completion as text (conversational ones: the messages' contents)."""
    if isinstance(value, str):
        return value
    return "\n".join(str(m.get("content", "")) for m in value if isinstance(m, dict))
