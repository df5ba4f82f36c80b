"""Rollout filters, generation rounds and carry-over in TRL's GRPOTrainer (and MaxEnt's).

The Rollouts component (train/components.py), hook `_generate_and_score_completions` (train
mode only): it calls the scoring below it (TRL's, with MaxEnt's weights) once per round, cuts
the output into groups, filters them (train/rollouts.py), and returns the kept groups as one
batch; TRL's `_prepare_inputs` shuffles and splits it as usual. Every process
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
from transformers import TrainerCallback

from maxent_grpo.rollout_filters import FilterSettings, Group, apply_filters, resolve_filters
from maxent_grpo.train import trl_adapter
from maxent_grpo.train.group_batches import merge_groups, text_tokenizer
from maxent_grpo.train.rollouts import (
    StepTally,
    choose_groups,
    group_signal,
    round_sizes,
    usable_groups,
)
from maxent_grpo.train.state import state_registry

logger = logging.getLogger(__name__)

# TRL's metrics of the whole generated batch, replaced by those of the trained groups.
_TRAINED_METRICS = ("reward", "reward_std", "frac_reward_zero_std")


class _SkipOptimizerStep(TrainerCallback):
    """A skipped step leaves the weights alone: no gradients, so the optimizer skips them."""

    def __init__(self, rollouts):
        self.rollouts = rollouts

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.rollouts.skip:
            for param in self.rollouts.trainer.model.parameters():
                param.grad = None


class Rollouts:
    """Component: rollout filters, generation rounds and carry-over (docs/rollouts.md), on with
    rollout_filters, max_generation_rounds > 1 or oversample_factor > 1."""

    name = "rollouts"
    needs = ()

    def __init__(self, trainer):
        self.trainer = trainer
        config = trainer.args
        self._filters = resolve_filters(config.rollout_filters or [])
        self._settings = FilterSettings(
            min_reward=config.rollout_min_reward,
            min_length=config.rollout_min_length,
            max_length=config.rollout_max_length,
            drop_truncated=config.rollout_drop_truncated,
        )
        self.carried: list[tuple[dict, list[float]]] = []
        self._reserve_position = 0
        self._reserve_order: tuple[int, list[int]] = (-1, [])
        self._round_capture = None
        self.skip = False  # this step trains on nothing: loss x 0, no gradients
        state_registry(trainer).register("rollouts", self._state, self._load, per_process=True)
        trainer.add_callback(_SkipOptimizerStep(self))

    # ---- one round ------------------------------------------------------------------------

    def rewards(self, call, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = call(inputs, prompts, completions, completion_ids_list)
        self._round_capture = (prompts, completions, completion_ids_list, rewards_per_func)
        return rewards_per_func

    def _reserve_rows(self, groups: int) -> list[dict]:
        """This process's share of the next `groups` x processes extra prompts, each repeated
        num_generations times: a seeded order of the dataset, the same on every process."""
        trainer = self.trainer
        world, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
        dataset = trainer.train_dataset
        size = len(dataset)
        rows = []
        for offset in range(rank * groups, (rank + 1) * groups):
            position = self._reserve_position + offset
            epoch = position // size
            if self._reserve_order[0] != epoch:  # a new pass over the data, a new order
                order = list(range(size))
                random.Random(trainer.args.seed + 1 + epoch).shuffle(order)
                self._reserve_order = (epoch, order)
            row = dataset[self._reserve_order[1][position % size]]
            rows.extend(dict(row) for _ in range(trainer.num_generations))
        self._reserve_position += groups * world
        return rows

    def _score_round(self, call, rows: list[dict]):
        trainer = self.trainer
        output = call(rows)
        prompts, completions, completion_ids, rewards_per_func = self._round_capture
        self._round_capture = None
        k, n = trainer.num_generations, len(rows)
        start = trainer.accelerator.process_index * n
        weights = trainer.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        local = rewards_per_func[start : start + n]
        rewards = (local * weights).nansum(dim=1)
        rewards[torch.isnan(local).all(dim=1)] = torch.nan
        rewards = rewards.tolist()
        stops = {*trainer.eos_token_ids, text_tokenizer(trainer).pad_token_id}
        groups, views = [], []
        for g in range(n // k):
            rows_g = slice(g * k, (g + 1) * k)
            groups.append((_group_tensors(output, rows_g, n), rewards[rows_g]))
            views.append(
                Group(
                    prompts=[_text(p) for p in prompts[rows_g]],
                    completions=[_text(c) for c in completions[rows_g]],
                    rewards=rewards[rows_g],
                    lengths=[len(ids) for ids in completion_ids[rows_g]],
                    truncated=[not ids or ids[-1] not in stops for ids in completion_ids[rows_g]],
                )
            )
        keep, per_filter = apply_filters(views, self._filters, self._settings)
        kept = [g for g, keep_g in zip(groups, keep, strict=True) if keep_g]
        return output, kept, len(groups), per_filter

    def _sum_over_processes(self, values: list[float]) -> list[float]:
        accelerator = self.trainer.accelerator
        if accelerator.num_processes == 1:  # no collective, no device round trip
            return [float(v) for v in values]
        local = torch.tensor(values, dtype=torch.float64, device=accelerator.device)
        return accelerator.reduce(local, reduction="sum").tolist()

    def _max_over_processes(self, value: int) -> int:
        accelerator = self.trainer.accelerator
        if accelerator.num_processes == 1:
            return int(value)
        local = torch.tensor([value], device=accelerator.device)
        return int(accelerator.gather(local).max().item())

    # ---- a step's rounds (also read by AsyncGeneration for the next step's first round) ----

    def round_needed(self, need: int, carried: int) -> bool:
        """Another round runs while some process holds fewer groups than it needs (a
        collective: every process asks at the same point)."""
        return self._max_over_processes(need - carried) > 0

    def round_rows(self, inputs, round_index: int, *, peek: bool = False) -> list[dict]:
        """The rows a round generates for: the step's own prompts and the over-sampled extra
        ones in round 0, extra prompts only later. `peek` reads them without moving the
        extra-prompt stream (async generation sends the next step's first round ahead)."""
        need = len(inputs) // self.trainer.num_generations
        first, later = round_sizes(need, self.trainer.args.oversample_factor)
        position = self._reserve_position
        if round_index == 0:
            rows = list(inputs) + self._reserve_rows(first - need)
        else:
            rows = self._reserve_rows(later)
        if peek:
            self._reserve_position = position
        return rows

    def first_round_rows(self, rows: list[dict]) -> list[dict] | None:
        """The rows the next step's first round will generate for, read ahead: None when the
        groups carried over fill it on every process."""
        if not self.round_needed(len(rows) // self.trainer.num_generations, len(self.carried)):
            return None
        return self.round_rows(rows, 0, peek=True)

    def generate_and_score(self, call, inputs):
        trainer = self.trainer
        if not trainer.model.training:
            return call(inputs)
        need = len(inputs) // trainer.num_generations
        metrics = trl_adapter.metrics(trainer)
        marks = {name: len(metrics[name]) for name in _TRAINED_METRICS}
        pool, self.carried = self.carried, []
        carried_here = len(pool)
        tally = StepTally(carried_in=int(self._sum_over_processes([len(pool)])[0]))
        last_output, kept_here, per_filter = self._rounds(call, inputs, need, pool, tally)
        usable = usable_groups(
            min(len(pool), need), trainer.num_generations, trainer.args.steps_per_generation
        )
        needed_total = int(self._sum_over_processes([need])[0])
        self.skip = self._max_over_processes(-usable) >= 0  # some process has none
        signals = [group_signal(rewards) for _, rewards in pool]
        picked, kept_over, dropped = choose_groups(
            signals, carried_here, usable, need, trainer.args.oversample_keep, self.skip
        )
        trained = [pool[i] for i in picked]
        batch = last_output if self.skip else self._merge([tensors for tensors, _ in trained])
        self.carried = [pool[i] for i in kept_over]
        counts = self._sum_over_processes(
            [len(trained), len(self.carried), len(dropped), sum(signals[i] for i in picked)]
        )
        tally.trained, tally.carried_out, tally.dropped = (int(c) for c in counts[:3])
        tally.signal_trained = counts[3]
        tally.skipped = self.skip
        for name, value in tally.metrics(per_filter).items():
            metrics[name].append(value)
        _warn(trainer.state.global_step + 1, tally, kept_here, needed_total)
        if not self.skip:
            self._replace_reward_metrics(marks, [rewards for _, rewards in trained])
        return batch

    def _rounds(self, call, inputs, need: int, pool: list, tally: StepTally):
        """Generate rounds into `pool` until every process has `need` groups or the rounds
        run out: (the last round's output, groups this process kept, kept per filter)."""
        names = list(self._filters)
        per_filter = dict.fromkeys(names, 0.0)
        last_output, kept_here = None, 0
        while tally.rounds < self.trainer.args.max_generation_rounds:
            if not self.round_needed(need, len(pool)):
                break
            rows = self.round_rows(inputs, tally.rounds)
            last_output, kept, generated, counts = self._score_round(call, rows)
            pool.extend(kept)
            kept_here += len(kept)
            sums = self._sum_over_processes([generated, len(kept)] + [counts[n] for n in names])
            tally.generated += int(sums[0])
            tally.kept += int(sums[1])
            for name, count in zip(names, sums[2:], strict=True):
                per_filter[name] += count
            tally.rounds += 1
        return last_output, kept_here, per_filter

    def _replace_reward_metrics(self, marks: dict, trained_rewards: list[list[float]]) -> None:
        """TRL's reward, reward_std and frac_reward_zero_std of the groups trained on."""
        metrics = trl_adapter.metrics(self.trainer)
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
        pad_token = text_tokenizer(self.trainer).pad_token_id
        batch = merge_groups(groups, pad_token)
        mask = batch["completion_mask"]
        if "tool_mask" in batch:
            mask = mask * batch["tool_mask"]
        batch["num_items_in_batch"] = self.trainer.accelerator.gather(mask.sum()).sum()
        return batch

    # ---- a skipped step -------------------------------------------------------------------

    def compute_loss(self, call, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = call(model, inputs, return_outputs, num_items_in_batch)
        # A skipped step still runs forward and backward (every process, in step), with no effect.
        return loss * 0.0 if self.skip else loss

    # ---- checkpoints ----------------------------------------------------------------------

    def _state(self) -> dict:
        return {
            "reserve_position": self._reserve_position,
            "carried": [
                ({key: t.cpu() for key, t in tensors.items()}, rewards)
                for tensors, rewards in self.carried
            ],
        }

    def _load(self, state: dict) -> None:
        device = self.trainer.accelerator.device
        self._reserve_position = int(state["reserve_position"])
        self.carried = [
            ({key: t.to(device) for key, t in tensors.items()}, list(rewards))
            for tensors, rewards in state["carried"]
        ]
        logger.warning(
            "rollouts: resumed %d carried groups, extra-prompt position %d",
            len(self.carried),
            self._reserve_position,
        )


def _group_tensors(output: dict, rows: slice, n: int) -> dict:
    tensors = {}
    for key, value in output.items():
        if key == "num_items_in_batch":
            continue
        if not (isinstance(value, torch.Tensor) and value.ndim >= 1 and len(value) == n):
            raise RuntimeError(f"rollout_filters: cannot regroup the batch key {key!r}")
        tensors[key] = value[rows]
    return tensors


def _warn(step: int, tally: StepTally, kept_here: int, needed_total: int) -> None:
    if tally.skipped:
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
    elif tally.trained < needed_total:
        logger.warning(
            "rollouts: step %d trains on %d of %d groups after %d rounds (short by %d)",
            step,
            tally.trained,
            needed_total,
            tally.rounds,
            needed_total - tally.trained,
        )


def _spread(rewards: list[float]) -> float:
    scored = [r for r in rewards if r == r]
    return max(scored) - min(scored) if len(scored) >= 2 else 0.0


def _text(value) -> str:
    """A prompt or completion as text (conversational ones: the messages' contents)."""
    if isinstance(value, str):
        return value
    return "\n".join(str(m.get("content", "")) for m in value if isinstance(m, dict))
