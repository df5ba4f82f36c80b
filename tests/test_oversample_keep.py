"""`oversample_keep: best` in a real run: one step of the tiny model on CPU (one process) with
`oversample_factor: 3`, trained once with `first` and once with `best` from the same seed, so
both see the same 6 groups; the step needs 2. `best` trains the 2 of largest reward spread,
`first` the first 2 (seconds each)."""

from __future__ import annotations

import pytest

from helpers.recipes import small_recipe
from maxent_grpo.train import rollout_rounds


def _one_step(folder, tiny_model, keep: str, monkeypatch) -> tuple[list, tuple, dict]:
    """(the pool's signals, choose_groups' answer, the step's metrics)."""
    from maxent_grpo.recipe import build_recipe, read_recipe
    from maxent_grpo.train.entry import _build_trainer
    from maxent_grpo.train_process import trainer_class

    seen = []
    choose = rollout_rounds.choose_groups

    def spy(signals, *args):
        seen.append((list(signals), choose(signals, *args)))
        return seen[-1][1]

    monkeypatch.setattr(rollout_rounds, "choose_groups", spy)
    path = small_recipe(
        folder / keep,
        tiny_model,
        reward_funcs=["digit_fraction"],  # dense: groups differ in spread
        reward_weights=[1.0],
        num_generations=4,
        per_device_train_batch_size=8,
        oversample_factor=3.0,
        oversample_keep=keep,
        max_steps=1,
    )
    recipe = build_recipe(read_recipe(["--config", str(path)]), 1)
    trainer = _build_trainer(recipe, trainer_class(recipe.method))
    trainer.train()
    (log,) = [e for e in trainer.state.log_history if "loss" in e]
    ((signals, chosen),) = seen
    return signals, chosen, log


@pytest.mark.integration
def test_best_trains_the_groups_of_largest_spread(tmp_path, tiny_model, monkeypatch):
    signals, (first, carried_first, _), log_first = _one_step(
        tmp_path, tiny_model, "first", monkeypatch
    )
    same, (best, carried_best, dropped), log_best = _one_step(
        tmp_path, tiny_model, "best", monkeypatch
    )
    assert same == signals and len(signals) == 6  # one seed: the same over-sample
    ranked = sorted(range(6), key=lambda i: -signals[i])
    assert first == [0, 1] and carried_first == [2, 3]
    assert best == ranked[:2] and carried_best == ranked[2:4] and dropped == ranked[4:]
    assert best != first, "the seed's over-sample should rank other groups first"
    mean = lambda picked: sum(signals[i] for i in picked) / 2  # noqa: E731
    assert log_best["rollouts/signal_trained"] == pytest.approx(mean(best))
    assert log_first["rollouts/signal_trained"] == pytest.approx(mean(first))
    assert log_best["rollouts/signal_trained"] > log_first["rollouts/signal_trained"]
