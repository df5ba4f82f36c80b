"""A resumed run sees its prompts in the order an uninterrupted run would.

TRL's RepeatSampler draws each epoch's permutation from one generator seeded once, at
construction, and has no `set_epoch`. A run resumed in epoch e >= 1 builds a fresh sampler, so
it replays epoch 0's order instead of epoch e's: other prompts than the uninterrupted run from
the first resumed step on (measured: final weights 1e-4 apart after a requeue in epoch 2).
Here the generator is re-seeded before every epoch and advanced past the epochs already done,
which gives the uninterrupted run's order on every path (and bare TRL's, when not resumed).
"""

from __future__ import annotations

from maxent_grpo.faults import failpoint


def epoch_seeded(sampler, current_epoch):
    """`sampler` (a RepeatSampler) whose generator is set for `current_epoch()` at each pass."""
    import torch
    from torch.utils.data import Sampler

    if not getattr(sampler, "shuffle", False) or getattr(sampler, "seed", None) is None:
        return sampler  # no shuffle or no seed: nothing to reproduce

    class EpochSeeded(Sampler):
        def __len__(self) -> int:
            return len(sampler)

        def __iter__(self):
            # failpoint data_order (`skip`): seeded off by one, another order (rehearse's test)
            sampler.generator.manual_seed(sampler.seed + failpoint("data_order"))
            for _ in range(current_epoch()):  # one permutation per epoch (RepeatSampler.__iter__)
                torch.randperm(sampler.num_samples, generator=sampler.generator)
            return iter(sampler)

    return EpochSeeded()


class EpochOrder:
    """Component (train/components.py): the train sampler through epoch_seeded."""

    name = "data_order"
    needs = ()

    def __init__(self, trainer):
        self.trainer = trainer

    def train_sampler(self, call, dataset=None):
        # state.epoch is the epochs done (a float: 2.35 in the middle of the third) when the
        # dataloader is iterated at each epoch's start, on a resume too (loaded before).
        return epoch_seeded(call(dataset), lambda: int(self.trainer.state.epoch or 0))
