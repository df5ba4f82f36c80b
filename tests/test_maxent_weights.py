"""MaxEnt-GRPO weight math, controllers and recipe keys: pure and fast (no training)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from maxent_grpo.maxent.controllers import TauController
from maxent_grpo.maxent.weights import (
    informative_groups,
    listwise_target_log_q,
    maxent_log_weights,
    maxent_weights,
    sequence_log_likelihood,
    weight_stats,
    weighted_policy_loss,
)
from maxent_grpo.recipe import ConfigError, parse_recipe
from maxent_grpo.recipe.maxent_keys import MaxEntConfig
from maxent_grpo.train.adaptive_kl import KLController

K = 4
RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def group_sums(w: torch.Tensor, k: int = K) -> torch.Tensor:
    return w.view(-1, k).sum(dim=-1)


# ---- weights ---------------------------------------------------------------------------------


def test_weights_are_a_distribution_per_group():
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0, -1.0, 3.0, 3.0, 0.0])
    ref = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.0, -1.0, -4.0, -2.0])
    w = maxent_weights(rewards, K, tau=0.5, beta=0.1, ref_log_likelihood=ref, q_epsilon=0.01)
    assert torch.allclose(group_sums(w), torch.ones(2))
    assert (w > 0).all()


def test_closed_form_matches_the_formula():
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0], dtype=torch.float64)
    ref = torch.tensor([-1.0, -2.0, -0.5, -3.0], dtype=torch.float64)
    tau, beta, temp, eps = 0.7, 0.3, 0.5, 0.02
    q = torch.softmax(rewards / temp, 0)
    q = (1 - K * eps) * q + eps
    q = q / q.sum()
    expected = torch.softmax(q.log() / (tau + beta) + beta / (tau + beta) * ref, 0)
    w = maxent_weights(rewards, K, tau, beta, ref, q_temperature=temp, q_epsilon=eps)
    assert torch.allclose(w, expected, atol=1e-12)


def test_closed_form_maximises_the_regularised_objective():
    """w* beats random points of the simplex on <w, log q> + tau H(w) - beta KL(w || pi_ref)."""
    torch.manual_seed(0)
    log_q = torch.log_softmax(torch.randn(K, dtype=torch.float64), 0)
    ref = torch.randn(K, dtype=torch.float64) - 2
    tau, beta = 0.4, 0.6
    log_pi_ref = torch.log_softmax(ref, 0)  # the reference restricted to the group

    def objective(w):
        entropy = -(w * w.log()).sum()
        kl = (w * (w.log() - log_pi_ref)).sum()
        return (w * log_q).sum() + tau * entropy - beta * kl

    best = maxent_log_weights(log_q.view(1, K), ref.view(1, K), tau, beta).exp().view(K)
    for _ in range(200):
        other = torch.distributions.Dirichlet(torch.ones(K, dtype=torch.float64)).sample()
        assert objective(best) >= objective(other) - 1e-12


def test_tau_to_infinity_gives_uniform_weights():
    """The Dr. GRPO limit: equal weights, whatever rewards and reference say."""
    rewards = torch.tensor([5.0, -3.0, 0.0, 1.0])
    ref = torch.tensor([-1.0, -8.0, -0.5, -3.0])
    w = maxent_weights(rewards, K, tau=1e8, beta=0.1, ref_log_likelihood=ref)
    assert torch.allclose(w, torch.full((K,), 1 / K), atol=1e-6)


def test_large_tau_weights_are_centred_rewards():
    """Near the limit, w - 1/K is proportional to r - mean(r): Dr. GRPO's advantage."""
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0], dtype=torch.float64)
    tau = 1e4
    w = maxent_weights(rewards, K, tau=tau)
    slope = (w - 1 / K) * K * tau
    assert torch.allclose(slope, rewards - rewards.mean(), rtol=1e-3)


def test_tau_to_zero_without_kl_concentrates_on_the_argmax():
    rewards = torch.tensor([0.1, 0.9, 0.3, 0.5, 2.0, 1.0, 1.5, 1.9])
    w = maxent_weights(rewards, K, tau=1e-4, beta=0.0, q_epsilon=0.05)
    expected = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    assert torch.allclose(w, expected, atol=1e-6)


def test_tau_to_zero_splits_ties_evenly():
    w = maxent_weights(torch.tensor([1.0, 3.0, 3.0, 0.0]), K, tau=1e-5)
    assert torch.allclose(w, torch.tensor([0.0, 0.5, 0.5, 0.0]), atol=1e-6)


def test_epsilon_floor_keeps_full_support():
    rewards = torch.tensor([0.0, 1000.0, -1000.0, 5.0])
    eps = 0.05
    q = listwise_target_log_q(rewards, K, temperature=1.0, epsilon=eps).exp().view(K)
    assert (q >= eps - 1e-7).all()
    assert torch.isclose(q.sum(), torch.tensor(1.0))
    w = maxent_weights(rewards, K, tau=1.0, q_epsilon=eps)
    assert (w > 0).all()
    # Without the floor the losers get (numerically) nothing.
    assert maxent_weights(rewards, K, tau=1.0, q_epsilon=0.0)[2] == 0


def test_epsilon_must_leave_a_distribution():
    with pytest.raises(ValueError):
        listwise_target_log_q(torch.zeros(K), K, temperature=1.0, epsilon=0.25)


def test_length_normalisation():
    logps = torch.tensor([[-1.0, -2.0, -3.0, 0.0], [-4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert sequence_log_likelihood(logps, mask, length_normalize=False).tolist() == [-6.0, -4.0]
    assert sequence_log_likelihood(logps, mask, length_normalize=True).tolist() == [-2.0, -4.0]
    empty = sequence_log_likelihood(logps, torch.zeros_like(mask), length_normalize=True)
    assert empty.tolist() == [0.0, 0.0]


def test_length_normalisation_removes_the_length_bias():
    """Same per-token likelihood, different lengths: only the summed version prefers short."""
    per_token = torch.full((K, 8), -1.0)
    lengths = torch.tensor([2, 4, 6, 8])
    mask = (torch.arange(8) < lengths.unsqueeze(1)).long()
    rewards = torch.zeros(K)
    for normalize, uniform in ((True, True), (False, False)):
        ll = sequence_log_likelihood(per_token, mask, normalize)
        w = maxent_weights(rewards, K, tau=0.5, beta=0.5, ref_log_likelihood=ll)
        assert torch.allclose(w, torch.full((K,), 1 / K)) == uniform
    assert w[0] > w[-1]  # summed: the shortest completion is the most likely


def test_permutation_equivariance_within_a_group():
    torch.manual_seed(1)
    rewards, ref = torch.randn(2 * K), torch.randn(2 * K) - 3
    w = maxent_weights(rewards, K, tau=0.3, beta=0.2, ref_log_likelihood=ref, q_epsilon=0.01)
    perm = torch.cat([torch.randperm(K), K + torch.randperm(K)])
    w_perm = maxent_weights(
        rewards[perm], K, tau=0.3, beta=0.2, ref_log_likelihood=ref[perm], q_epsilon=0.01
    )
    assert torch.allclose(w_perm, w[perm], atol=1e-7)


def test_groups_are_independent():
    rewards, ref = torch.randn(2 * K), torch.randn(2 * K)
    w = maxent_weights(rewards, K, tau=0.3, beta=0.2, ref_log_likelihood=ref)
    changed = rewards.clone()
    changed[K:] += 100 * torch.randn(K)
    w2 = maxent_weights(changed, K, tau=0.3, beta=0.2, ref_log_likelihood=ref)
    assert torch.equal(w[:K], w2[:K])


@pytest.mark.parametrize("eps", [0.0, 0.01])
@pytest.mark.parametrize("tau,beta", [(1.0, 0.0), (1e-30, 0.0), (0.5, 0.5), (1e-30, 1e-30)])
def test_no_nan_or_inf_for_extreme_inputs(tau, beta, eps):
    big = torch.finfo(torch.float32).max
    rewards = torch.tensor([1e30, -1e30, big, -big, math.inf, -math.inf, 0.0, 1e38])
    ref = torch.tensor([-1e30, -math.inf, 0.0, -big, -1e38, 1e30, math.inf, -5.0])
    w = maxent_weights(rewards, K, tau=tau, beta=beta, ref_log_likelihood=ref, q_epsilon=eps)
    assert torch.isfinite(w).all()
    assert torch.allclose(group_sums(w), torch.ones(2), atol=1e-5)
    assert (w >= 0).all()


def test_huge_summed_log_probs_keep_weights_finite():
    per_token = torch.full((K, 4096), -80.0)
    per_token[0] = -math.inf  # a token the reference could not produce
    ll = sequence_log_likelihood(per_token, torch.ones(K, 4096), length_normalize=False)
    w = maxent_weights(torch.zeros(K), K, tau=0.1, beta=1.0, ref_log_likelihood=ll)
    assert torch.isfinite(w).all() and torch.isclose(w.sum(), torch.tensor(1.0))
    assert w[0] == 0


def test_unscorable_completions_get_no_weight():
    nan = float("nan")
    rewards = torch.tensor([1.0, nan, 0.0, 2.0, nan, nan, nan, nan])
    w = maxent_weights(rewards, K, tau=1.0, q_epsilon=0.05)
    assert w[1] == 0 and torch.isclose(w[:K].sum(), torch.tensor(1.0))
    assert (w[[0, 2, 3]] > 0).all()
    assert torch.equal(w[K:], torch.zeros(K))  # a group with no reward carries no signal


def test_bf16_inputs_are_computed_in_float32():
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0], dtype=torch.bfloat16)
    w = maxent_weights(rewards, K, tau=1.0)
    assert w.dtype == torch.float32


def test_weight_stats():
    w = torch.tensor([0.25, 0.25, 0.25, 0.25, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    stats = weight_stats(w, K)  # the empty third group is left out
    assert math.isclose(stats.entropy, math.log(4) / 2)
    assert math.isclose(stats.ess, (4 + 1) / 2)
    assert math.isclose(stats.max_weight, (0.25 + 1) / 2)
    only_first = weight_stats(w, K, torch.tensor([True, False, False]))
    assert math.isclose(only_first.ess, 4.0)
    assert weight_stats(torch.zeros(K), K) is None


def test_informative_groups():
    nan = float("nan")
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, nan, nan, nan])
    assert informative_groups(rewards, K).tolist() == [False, True, False]


# ---- loss ------------------------------------------------------------------------------------


def test_loss_value_and_gradient_on_policy():
    torch.manual_seed(0)
    logps = (torch.randn(K, 5) - 2).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    w = torch.softmax(torch.randn(K), 0)
    loss = weighted_policy_loss(logps, logps.detach(), mask, w * K, 0.2, 0.2).mean()
    mean_logp = (logps * mask).sum(-1) / mask.sum(-1)
    objective = (w * mean_logp).sum()
    assert torch.isclose(loss, -objective)
    (grad,) = torch.autograd.grad(loss, logps)
    (expected,) = torch.autograd.grad(-objective, logps)
    assert torch.allclose(grad, expected)


def test_loss_clips_ratios_above_one_plus_epsilon():
    logps = torch.zeros(2, 3, requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])  # second row: ratio e > 1.2
    loss = weighted_policy_loss(logps, old, torch.ones(2, 3), torch.ones(2), 0.2, 0.2).sum()
    loss.backward()
    assert torch.allclose(logps.grad[0], torch.full((3,), -1 / 3))
    assert torch.equal(logps.grad[1], torch.zeros(3))


# ---- controllers -----------------------------------------------------------------------------


def test_kl_controller_formula():
    c = KLController(0.1, target=0.05, horizon=100)
    assert math.isclose(c.update(0.06, 10), 0.1 * (1 + 0.2 * 10 / 100))  # error 0.2
    c = KLController(0.1, target=0.05, horizon=100)
    assert math.isclose(c.update(0.5, 10), 0.1 * (1 + 0.2 * 0.1))  # error clipped to 0.2
    c = KLController(0.1, target=0.05, horizon=100)
    assert math.isclose(c.update(0.0, 10), 0.1 * (1 - 0.2 * 0.1))  # error clipped to -0.2


@pytest.mark.parametrize("init_beta", [0.001, 1.0])
def test_kl_controller_moves_beta_toward_the_target_from_both_sides(init_beta):
    """A toy policy whose KL falls as beta rises: KL(beta) = 0.01 / beta, target 0.1 -> 0.1."""
    c = KLController(init_beta, target=0.1, horizon=1000)
    kls = []
    for _ in range(3000):
        kl = 0.01 / c.beta
        kls.append(kl)
        c.update(kl, 64)
    side = 1 if kls[0] > 0.1 else -1
    assert side * (kls[0] - 0.1) > 0.05  # started far away ...
    assert abs(kls[-1] - 0.1) < 1e-3  # ... ended on target
    assert math.isclose(c.beta, 0.1, rel_tol=1e-2)


def test_kl_controller_fixed_and_state():
    fixed = KLController(0.3)
    assert fixed.update(10.0, 100) == 0.3
    c = KLController(0.2, target=0.1, horizon=50)
    c.update(0.3, 7)
    restored = KLController(0.2, target=0.1, horizon=50)
    restored.load_state_dict(c.state_dict())
    assert restored.beta == c.beta
    assert c.update(float("nan"), 7) == restored.beta  # no measurement, no change


def test_tau_controller_moves_toward_target_entropy():
    c = TauController(1.0, target_entropy=1.0, lr=0.5, tau_min=0.01, tau_max=100)
    assert c.update(1.3) < 1.0  # too flat: lower tau
    c = TauController(1.0, target_entropy=1.0, lr=0.5, tau_min=0.01, tau_max=100)
    assert c.update(0.2) > 1.0  # too sharp: raise tau
    c = TauController(1.0, target_entropy=1.0, lr=100.0, tau_min=0.5, tau_max=2.0)
    assert c.update(0.0) == 2.0 and c.update(5.0) == 0.5  # bounded
    assert TauController(0.7).update(0.0) == 0.7  # fixed without a target


def test_tau_controller_reaches_target_on_real_weights():
    rewards = torch.tensor([0.0, 1.0, 0.5, 2.0, 1.0, 1.0, 0.0, 3.0])
    c = TauController(5.0, target_entropy=0.9, lr=0.5, tau_min=1e-3, tau_max=1e3)
    for _ in range(300):
        entropy = weight_stats(maxent_weights(rewards, K, tau=c.tau), K).entropy
        c.update(entropy)
    assert abs(entropy - 0.9) < 1e-3
    restored = TauController(5.0, target_entropy=0.9, lr=0.5, tau_min=1e-3, tau_max=1e3)
    restored.load_state_dict(c.state_dict())
    assert restored.tau == c.tau


# ---- recipe keys -----------------------------------------------------------------------------


def make_config(**overrides) -> MaxEntConfig:
    base = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False, "report_to": "none"}
    base.update(per_device_train_batch_size=4, num_generations=4)
    return MaxEntConfig(**{**base, **overrides})


def test_init_kl_coeff_sets_trls_beta():
    assert make_config().beta == 0.0
    config = make_config(init_kl_coeff=0.04)
    assert config.beta == 0.04


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"beta": 0.04}, "beta"),
        ({"maxent_tau": 0.0}, "maxent_tau"),
        ({"maxent_q_temperature": -1.0}, "maxent_q_temperature"),
        ({"maxent_q_epsilon": 0.25}, "maxent_q_epsilon"),
        ({"maxent_q_epsilon": -0.1}, "maxent_q_epsilon"),
        ({"init_kl_coeff": -0.1}, "init_kl_coeff"),
        ({"kl_target": 0.1}, "kl_horizon"),
        ({"kl_horizon": 100}, "kl_target"),
        ({"kl_target": 0.1, "kl_horizon": 100}, "init_kl_coeff"),
        ({"kl_target": -1.0, "kl_horizon": 100, "init_kl_coeff": 0.1}, "kl_target"),
        ({"maxent_tau_lr": 0.2}, "maxent_tau_lr"),
        ({"maxent_tau_max": 10.0}, "maxent_tau_max"),
        ({"maxent_target_weight_entropy": 2.0}, "maxent_target_weight_entropy"),
        ({"maxent_target_weight_entropy": 1.0, "maxent_tau_min": 2.0}, "maxent_tau"),
        ({"maxent_target_weight_entropy": 1.0, "maxent_tau_lr": 0.0}, "maxent_tau_lr"),
        ({"maxent_target_weight_entropy": 1.0, "maxent_tau_min": 0.0}, "maxent_tau_min"),
        ({"sync_ref_model": True}, "sync_ref_model"),
        ({"loss_type": "grpo"}, "loss_type"),
        ({"scale_rewards": "batch"}, "scale_rewards"),
        ({"entropy_coef": 0.01}, "entropy_coef"),
        ({"importance_sampling_level": "sequence"}, "importance_sampling_level"),
    ],
)
def test_bad_keys_are_one_line_config_errors(overrides, key):
    with pytest.raises(ConfigError) as info:
        make_config(**overrides)
    message = str(info.value)
    assert message.startswith(f"{key}:") and "\n" not in message


def test_tau_controller_defaults_are_the_fields_alone():
    """One default per knob: the field's, with or without a target; the default written out
    without a target changes nothing and is accepted."""
    for config in (make_config(maxent_target_weight_entropy=1.0), make_config()):
        assert (config.maxent_tau_lr, config.maxent_tau_min, config.maxent_tau_max) == (
            0.1,
            1e-3,
            1e3,
        )
    assert make_config(maxent_tau_lr=0.1, maxent_tau_max=1e3).maxent_tau_lr == 0.1


def test_recipes_parse():
    smoke = parse_recipe(["--config", str(RECIPES / "smoke/config_maxent.yaml")], world_size=2)
    assert isinstance(smoke.training, MaxEntConfig) and smoke.method == "maxent"
    smoke = smoke.training
    assert smoke.beta == smoke.init_kl_coeff > 0 and smoke.kl_target is not None
    cluster = parse_recipe(
        ["--config", str(RECIPES / "Qwen2.5-1.5B-Instruct/maxent-grpo/config_math.yaml")]
        + ["--use_cpu", "true", "--bf16", "false"],
        world_size=7,
    ).training
    assert cluster.generation_batch_size == 16 * 7 * 4
    assert cluster.beta == cluster.init_kl_coeff


def test_recipe_error_names_the_file(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("output_dir: /tmp/x\nuse_cpu: true\nbf16: false\nmaxent_q_epsilon: 0.5\n")
    with pytest.raises(ConfigError, match=r"^.*bad\.yaml: maxent_q_epsilon: 0\.5"):
        parse_recipe(["--config", str(recipe)], "maxent", world_size=1)


def test_kl_horizon_is_checked_for_the_planned_processes(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "output_dir: /tmp/x\nuse_cpu: true\nbf16: false\nper_device_train_batch_size: 8\n"
        "num_generations: 8\ninit_kl_coeff: 0.1\nkl_target: 0.05\nkl_horizon: 16\n"
    )
    argv = ["--config", str(recipe)]
    assert parse_recipe(argv, "maxent", world_size=2).training.kl_horizon == 16
    with pytest.raises(ConfigError, match="kl_horizon: 16: below the 24 completions"):
        parse_recipe(argv, "maxent", world_size=3)
