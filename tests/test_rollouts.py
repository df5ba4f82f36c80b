"""Rollout filters, round sizes and the recipe checks of their keys (no training: seconds)."""

from __future__ import annotations

import math

import pytest

from helpers.paths import SMOKE as SMOKE_GRPO
from maxent_grpo.errors import ConfigError
from maxent_grpo.recipe.keys import GRPOConfig
from maxent_grpo.recipe.parser import read_recipe
from maxent_grpo.rollout_filters import FilterSettings, Group, apply_filters, resolve_filters
from maxent_grpo.train.rollouts import StepTally, round_sizes, usable_groups

SETTINGS = FilterSettings()


def group(rewards, completions=None, lengths=None, truncated=None) -> Group:
    n = len(rewards)
    return Group(
        prompts=["p"] * n,
        completions=completions or [f"c{i}" for i in range(n)],
        rewards=rewards,
        lengths=lengths or [5] * n,
        truncated=truncated or [False] * n,
    )


def keeps(name: str, g: Group, settings: FilterSettings = SETTINGS) -> bool:
    keep, _ = apply_filters([g], resolve_filters([name]), settings)
    return keep[0]


def test_nonzero_std_keeps_only_groups_whose_rewards_differ():
    assert keeps("nonzero_std", group([0.0, 1.0, 0.0, 0.0]))
    assert not keeps("nonzero_std", group([1.0, 1.0, 1.0, 1.0]))
    assert not keeps("nonzero_std", group([0.5, 0.5 + 1e-9]))
    # Unscored completions (NaN) do not count as spread.
    assert not keeps("nonzero_std", group([1.0, math.nan, 1.0]))
    assert keeps("nonzero_std", group([1.0, math.nan, 0.0]))


def test_min_reward_looks_at_the_best_completion():
    settings = FilterSettings(min_reward=0.5)
    assert keeps("min_reward", group([0.0, 0.6]), settings)
    assert not keeps("min_reward", group([0.0, 0.4]), settings)
    assert not keeps("min_reward", group([math.nan, math.nan]), settings)


def test_diverse_drops_identical_completions():
    assert not keeps("diverse", group([0.0, 1.0], completions=["same", "same"]))
    assert keeps("diverse", group([0.0, 1.0], completions=["a", "b"]))


def test_length_bounds_and_truncation():
    bounded = FilterSettings(min_length=2, max_length=10)
    assert keeps("length", group([0, 1], lengths=[2, 10]), bounded)
    assert not keeps("length", group([0, 1], lengths=[1, 5]), bounded)
    assert not keeps("length", group([0, 1], lengths=[5, 11]), bounded)
    cut = group([0, 1], truncated=[False, True])
    assert keeps("length", cut, SETTINGS)
    assert not keeps("length", cut, FilterSettings(drop_truncated=True))


def test_every_filter_must_keep_a_group_and_each_is_counted_alone():
    groups = [group([0.0, 1.0]), group([1.0, 1.0]), group([0.0, 0.0])]
    keep, counts = apply_filters(
        groups, resolve_filters(["nonzero_std", "min_reward"]), FilterSettings(min_reward=1.0)
    )
    assert keep == [True, False, False]
    assert counts == {"nonzero_std": 1, "min_reward": 2}


def best_above_half(prompts, completions, rewards):
    return max(rewards) > 0.5


def test_a_custom_filter_gets_the_groups_texts_and_rewards():
    filters = resolve_filters([f"{__name__}:best_above_half"])
    keep, _ = apply_filters([group([0.0, 0.9]), group([0.1, 0.2])], filters, SETTINGS)
    assert keep == [True, False]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nonzero", "unknown filter 'nonzero'"),
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz:f'"),
        ("math:no_such_function", "cannot import 'math:no_such_function'"),
        ("math:pi", "is not callable"),
    ],
)
def test_bad_filter_names_are_refused_when_the_recipe_is_built(name, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(output_dir="/tmp/x", rollout_filters=[name], use_cpu=True)


def test_each_bad_value_gets_its_own_line():
    # Ranges: when the recipe is read (launcher, no TRL); filters: when it is built (check).
    with pytest.raises(ConfigError) as exc:
        read_recipe(
            ["--config", str(SMOKE_GRPO), "--oversample_factor", "0.5"]
            + ["--max_generation_rounds", "0"]
        )
    lines = str(exc.value).splitlines()
    assert len(lines) == 2 and "max_generation_rounds" in lines[0], lines
    assert "oversample_factor" in lines[1]
    with pytest.raises(ConfigError) as exc:
        GRPOConfig(output_dir="/tmp/x", rollout_filters=["nope", "math:pi"], use_cpu=True)
    assert len(str(exc.value).splitlines()) == 2


def test_groups_must_be_whole_on_each_process():
    # 6 completions per process, groups of 4: a group would span two processes.
    with pytest.raises(ConfigError, match="whole groups on each process"):
        GRPOConfig(
            output_dir="/tmp/x",
            per_device_train_batch_size=6,
            num_generations=4,
            generation_batch_size=12,
            rollout_filters=["nonzero_std"],
            use_cpu=True,
        )


def test_round_sizes_oversample_only_the_first_round():
    assert round_sizes(4, 1.0) == (4, 4)
    assert round_sizes(4, 1.5) == (6, 4)
    assert round_sizes(3, 1.1) == (4, 3)


def test_usable_groups_split_evenly_into_micro_batches():
    # groups of 4 completions, 8 micro-batches: only an even number of groups splits evenly
    assert usable_groups(3, 4, 8) == 2
    assert usable_groups(1, 4, 8) == 0
    assert usable_groups(5, 4, 1) == 5


def test_tally_metrics_name_each_filter():
    tally = StepTally(generated=8, kept=2, rounds=2, carried_in=1, trained=2, signal_trained=0.9)
    metrics = tally.metrics({"nonzero_std": 2.0, "diverse": 8.0})
    assert metrics["rollouts/signal_trained"] == 0.45  # the mean over the trained groups
    assert StepTally().metrics({})["rollouts/signal_trained"] == 0.0
    assert metrics["rollouts/kept_fraction/nonzero_std"] == 0.25
    assert metrics["rollouts/kept_fraction/diverse"] == 1.0
    assert metrics["rollouts/rounds"] == 2.0
    assert metrics["rollouts/carried_in"] == 1.0


def test_runs_and_plot_show_the_rollout_counts():
    from maxent_grpo.runs.plot import series_keys
    from maxent_grpo.runs.table import RunInfo, _progress, detail_text

    metrics = StepTally(generated=8, kept=3, rounds=4, carried_in=1, trained=2).metrics(
        {"nonzero_std": 3}
    )
    keys = series_keys([{"step": 1, "reward": 0.5, **metrics}])
    assert "rollouts/kept_fraction/nonzero_std" in keys
    assert "rollouts/groups_kept" in keys and "rollouts/rounds" in keys
    info = RunInfo(run="r")
    # The end-of-training summary comes last and has no rollout counts.
    _progress(info, None, [{"step": 1, "metrics": metrics}, {"step": 1, "metrics": {}}])
    assert detail_text(info) == "rollouts: 3/8 groups kept, 4 rounds, 1 carried"


def test_a_group_s_signal_is_the_spread_of_its_scored_rewards():
    from maxent_grpo.train.rollouts import group_signal

    assert group_signal([0.0, 1.0, 0.0, 1.0]) == 0.5  # half right: the largest for 0/1
    assert math.isclose(group_signal([0.0, 1.0, 0.0, 0.0]), math.sqrt(3) / 4)
    assert group_signal([1.0, 1.0, 1.0]) == 0.0
    assert group_signal([1.0, math.nan, 0.0]) == 0.5  # unscored completions left out
    assert group_signal([1.0, math.nan]) == 0.0


SIGNALS = [0.1, 0.5, 0.0, 0.4, 0.3]  # a pool of 5 groups, none carried in


def test_best_trains_the_largest_signals_and_carries_the_next_best():
    from maxent_grpo.train.rollouts import choose_groups

    assert choose_groups(SIGNALS, 0, 2, 2, "best", False) == ([1, 3], [4, 0], [2])
    # today's rule, unchanged: the first groups, the next ones carried, the rest dropped
    assert choose_groups(SIGNALS, 0, 2, 2, "first", False) == ([0, 1], [2, 3], [4])
    # ties keep the pool's order (carried groups first, then the order generated)
    assert choose_groups([0.5, 0.5, 0.5], 0, 1, 1, "best", False) == ([0], [1], [2])


def test_best_carries_a_group_over_at_most_once():
    from maxent_grpo.train.rollouts import choose_groups

    # group 0 was carried in and loses again: dropped, not carried a second time
    assert choose_groups([0.2, 0.9, 0.1], 1, 1, 2, "best", False) == ([1], [2], [0])
    assert choose_groups([0.2, 0.9, 0.1], 1, 1, 2, "first", False) == ([0], [1, 2], [])
    # a skipped step trains nothing and drops nothing it could carry
    assert choose_groups([0.2, 0.9, 0.1], 1, 1, 2, "best", True) == ([], [1, 0], [2])


def test_oversample_keep_takes_only_its_choices_and_needs_a_choice():
    with pytest.raises(ConfigError, match="oversample_keep"):
        read_recipe(["--config", str(SMOKE_GRPO), "--oversample_keep", "largest"])
    with pytest.raises(ConfigError, match="oversample_keep: best with nothing to choose from"):
        GRPOConfig(output_dir="/tmp/x", oversample_keep="best", use_cpu=True)
    GRPOConfig(output_dir="/tmp/x", oversample_keep="best", oversample_factor=2.0, use_cpu=True)
