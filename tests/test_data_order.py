"""A resumed run's prompt order: TRL's RepeatSampler through train/data_order.epoch_seeded."""

from __future__ import annotations

from trl.trainer.utils import RepeatSampler

from maxent_grpo.train.data_order import epoch_seeded


def sampler(seed=7, shuffle=True):
    return RepeatSampler(
        list(range(10)), mini_repeat_count=2, batch_size=5, shuffle=shuffle, seed=seed
    )


def test_a_fresh_sampler_in_epoch_e_gives_the_uninterrupted_order_of_epoch_e():
    uninterrupted = sampler()
    orders = [list(uninterrupted) for _ in range(3)]  # epochs 0, 1, 2 of one run
    assert orders[0] != orders[1] != orders[2]
    for epoch in range(3):
        resumed = epoch_seeded(sampler(), lambda epoch=epoch: epoch)
        assert list(resumed) == orders[epoch]
        assert len(resumed) == len(orders[epoch])


def test_an_uninterrupted_run_keeps_trl_s_order():
    epoch = 0
    wrapped, plain = epoch_seeded(sampler(), lambda: epoch), sampler()
    for epoch in range(3):  # noqa: B007 - read by the lambda
        assert list(wrapped) == list(plain)


def test_unshuffled_or_unseeded_samplers_are_left_alone():
    for unwrapped in (sampler(shuffle=False), sampler(seed=None)):
        assert epoch_seeded(unwrapped, lambda: 1) is unwrapped
