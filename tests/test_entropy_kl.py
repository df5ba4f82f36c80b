"""The KL-adaptive entropy bonus (train/entropy_kl.py): upstream MaxEnt-GRPO's rule on TRL's
entropy_coef, checked against upstream's formulas step by step in a real CPU run of
src/grpo.py on the tiny model, and the recipe checks of its keys.
"""

from __future__ import annotations

import math

import pytest

from helpers.recipes import write_recipe
from maxent_grpo.errors import ConfigError
from maxent_grpo.recipe.keys import GRPOConfig
from maxent_grpo.train.entropy_kl import EntropyKLRule
from test_grpo_adaptive_kl import step_logs, train

BASE, THRESHOLD, GAIN = 0.3, 0.02, 0.5


def upstream_multiplier(kl: float, raise_on_low: bool, lower_on_high: bool, gate: bool) -> float:
    """Upstream's `_resolve_effective_maxent_alpha` (liv-daliberti/maxent-grpo, before commit
    955c288), with its defaults min 0.5 / max 2.0 and this file's gain, restated from its code."""
    if kl < THRESHOLD and raise_on_low:
        m = 1.0 + GAIN * max(THRESHOLD - kl, 0.0) / THRESHOLD
    elif kl > THRESHOLD and gate:
        return 0.0
    elif kl > THRESHOLD and lower_on_high:
        m = 1.0 / (1.0 + GAIN * max(kl - THRESHOLD, 0.0) / THRESHOLD)
    else:
        m = 1.0
    return min(max(m, 0.5), 2.0)


@pytest.mark.parametrize("kl", [0.0, 0.005, 0.02, 0.025, 0.05, 0.5, 50.0])
@pytest.mark.parametrize(
    "below, above", [("raise", "keep"), ("keep", "lower"), ("raise", "lower"), ("raise", "off")]
)
def test_rule_is_upstreams(kl, below, above):
    rule = EntropyKLRule(THRESHOLD, below=below, above=above, gain=GAIN)
    expected = upstream_multiplier(kl, below == "raise", above == "lower", above == "off")
    assert rule.multiplier(kl) == pytest.approx(expected, rel=1e-12)


def test_non_finite_kl():
    rule = EntropyKLRule(THRESHOLD, below="raise", above="lower")
    assert rule.multiplier(math.inf) == 0.5  # upstream: the least multiplier when lowering
    assert EntropyKLRule(THRESHOLD, above="off").multiplier(math.nan) == 0.0


@pytest.mark.parametrize(
    "keys, problem",
    [
        (dict(entropy_coef=0.0, beta=0.04), "set entropy_coef > 0"),
        (dict(entropy_coef=0.1, beta=0.0), "set beta"),
        (dict(entropy_coef=0.1, beta=0.04, use_adaptive_entropy=True), "keep one of them"),
        (dict(entropy_coef=0.1, beta=0.04, entropy_kl_below="keep"), "nothing adapts"),
    ],
)
def test_refused_combinations(keys, problem):
    keys = {"entropy_kl_threshold": THRESHOLD, "entropy_kl_below": "raise", **keys}
    with pytest.raises(ConfigError, match=problem):
        GRPOConfig(output_dir="unused", report_to=[], **keys)


@pytest.mark.integration
def test_coefficient_follows_each_steps_kl(tmp_path, tiny_model):
    """Every step (one micro-batch each) applies BASE x m(KL) / ln(V), with KL the one TRL
    penalises on that micro-batch: not the previous step's, not a fixed coefficient."""
    recipe = write_recipe(
        tmp_path,
        model_name_or_path=str(tiny_model),
        dataset_num_rows=64,
        reward_funcs=["digit_fraction"],
        reward_weights=None,
        num_generations=4,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        max_completion_length=16,
        learning_rate=3.0e-3,  # the KL grows over the steps
        beta=0.04,
        entropy_coef=BASE,
        entropy_normalize_by_max=True,
        entropy_kl_threshold=THRESHOLD,
        entropy_kl_below="raise",
        entropy_kl_above="lower",
        entropy_kl_gain=GAIN,
        max_steps=5,
        save_steps=5,
    )
    train(recipe)
    logs = step_logs(tmp_path / "out")
    assert sorted(logs) == [1, 2, 3, 4, 5]
    scale = math.log(tiny_vocabulary(tiny_model))
    multipliers = []
    for step, log in sorted(logs.items()):
        kl = log["entropy_kl/kl"]
        print(f"step {step}: kl {kl:.5f}, entropy_coef {log['entropy_coef']:.5f}")
        assert kl == pytest.approx(log["kl"], rel=1e-5, abs=1e-9)  # TRL's KL of this loss
        m = upstream_multiplier(kl, raise_on_low=True, lower_on_high=True, gate=False)
        assert log["entropy_kl/multiplier"] == pytest.approx(m, rel=1e-9)
        assert log["entropy_coef"] == pytest.approx(BASE * m / scale, rel=1e-6)
        multipliers.append(m)
    assert multipliers[0] == 1.0 + GAIN  # step 1: the policy is the reference, KL 0
    assert len(set(multipliers)) >= 3, multipliers  # it follows the KL, step by step


def tiny_vocabulary(tiny_model) -> int:
    from transformers import AutoConfig, AutoTokenizer

    vocab = AutoConfig.from_pretrained(tiny_model).vocab_size
    return min(vocab, len(AutoTokenizer.from_pretrained(tiny_model)))
