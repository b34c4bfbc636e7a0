"""REINFORCE / GPG, SAPO, GMPO, Clip-Cov, KL-Cov and PF-PPO weights on tiny tensors, and against
step-by-step restatements of verl's on random inputs (tests/verl_reference.py)."""

import math

import pytest
import torch

from tensordict import TensorDict

import verl_reference as verl
from flowrl.rl.correction import RolloutCorrectionConfig
from flowrl.rl.losses import gmpo_loss
from flowrl.rl.ops.aggregate import agg_loss
from flowrl.rl.ops.cov_loss import clip_cov, kl_cov, token_covariance
from flowrl.rl.ops.policy_gradient import gmpo, gpg, reinforce, sapo
from flowrl.rl.ops.rewards import pf_ppo_resample, pf_ppo_weights

NAN = float("nan")


def t(*rows):
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.float32)


def leaf(x):
    return x.clone().requires_grad_(True)


ADV = t(1.0, -1.0, 2.0)
ONES = torch.ones(3)


@pytest.mark.parametrize("objective", [reinforce, gpg])
def test_reinforce_is_minus_advantage_times_logprob(objective):
    # logp [-1, -2, -.5], A [1, -1, 2] -> -A * logp = [1, -2, 1]; gradient -A whatever the old logprobs
    logp = leaf(t(-1.0, -2.0, -0.5))
    loss, metrics = objective(logp, t(-3.0, 0.0, -0.5), ADV, ONES)
    assert torch.equal(loss, t(1.0, -2.0, 1.0)) and metrics["clipfrac"] == 0.0
    loss.sum().backward()
    assert torch.equal(logp.grad, -ADV)


def test_sapo_soft_gate():
    # on-policy r = 1: gate sigmoid(0) * 4 / tau = 2 / tau; tau [1, 1.05, 1] (A <= 0 takes tau_neg)
    logp = leaf(torch.zeros(3))
    loss, _ = sapo(logp, torch.zeros(3), ADV, ONES)
    assert torch.allclose(loss, t(-2.0, 2 / 1.05 * 2, -4.0) / t(1.0, 2.0, 1.0))
    # d gate / d logp at r = 1: sigmoid'(0) * tau * 4 / tau = 1 -> gradient -A, the policy gradient
    loss.sum().backward()
    assert torch.allclose(logp.grad, -ADV)
    # far off-policy the gate saturates: r = e^3, A = 1, tau 1 -> 4 * sigmoid(e^3 - 1) ~ 4, gradient ~ 0
    far = leaf(t(3.0))
    loss, _ = sapo(far, t(0.0), t(1.0), t(1.0))
    loss.backward()
    assert loss.item() == pytest.approx(-4 / (1 + math.exp(-(math.e ** 3 - 1))), rel=1e-6) and far.grad.abs() < 1e-6


def test_gmpo_geometric_mean_of_sign_clipped_ratios():
    # A = 1: log-ratios [.1, .5, -.2] clipped above at .4 -> [.1, .4, -.2]; mean .1 -> loss -e^.1 on each token
    loss, metrics = gmpo(t([[0.1, 0.5, -0.2]]), torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3))
    assert torch.allclose(loss, torch.full((1, 3), -math.exp(0.1)))
    assert metrics["clipfrac"] == pytest.approx(1 / 3) and metrics["clipfrac_lower"] == 0.0
    # A = -1: clipped below at -.4 only: [.1, -.5, .2] -> [.1, -.4, .2], mean -.1/3 -> +e^(-1/30) = .96722
    loss, metrics = gmpo(t([[0.1, -0.5, 0.2]]), torch.zeros(1, 3), -torch.ones(1, 3), torch.ones(1, 3))
    assert torch.allclose(loss, torch.full((1, 3), math.exp(-0.1 / 3)))
    assert metrics["clipfrac_lower"] == pytest.approx(1 / 3)
    # with seq-mean-token-mean the batch loss is the mean over rows, as verl's torch.mean
    two = gmpo(t([[0.1, 0.5, -0.2], [0.0, 0.0, NAN]]), torch.zeros(2, 3), torch.ones(2, 3), t([1, 1, 1], [1, 1, 0]))
    assert agg_loss(two[0], t([1, 1, 1], [1, 1, 0]), "seq-mean-token-mean").item() == pytest.approx(
        (-math.exp(0.1) - 1) / 2)


def gmpo_mb(old, rollout, adv, mask):
    return TensorDict({"old_logprobs": old, "rollout_logprobs": rollout, "advantages": adv, "loss_mask": mask},
                      batch_size=[old.shape[0]])


def test_gmpo_rollout_is_weights_join_the_geometric_mean():
    # logp = old: GMPO ratio 1. Row 0: A = 1, rho = [2, .5] (TIS threshold 2 keeps both), padding last.
    # Row 1: A = -1, an interior gap, rho = [.5, -, .5]. Row losses -1 * sqrt(2 * .5) = -1 and +1 * .5 = .5,
    # seq-mean-token-mean: (-1 + .5) / 2 = -.25 (arithmetic mean of the weights: (-1.25 + .5) / 2 = -.375)
    mask = t([1, 1, 0], [1, 0, 1])
    old = torch.full((2, 3), -1.0)
    rollout = old - t([math.log(2), math.log(0.5), NAN], [math.log(0.5), NAN, math.log(0.5)])
    adv = t([1, 1, 1], [-1, -1, -1])
    loss_fn = gmpo_loss(rollout_correction=RolloutCorrectionConfig(is_level="token", is_threshold=2.0).build())
    loss, _ = loss_fn({"logprobs": old.clone()}, gmpo_mb(old, rollout, adv, mask))
    assert loss.item() == pytest.approx(-0.25, abs=1e-6)
    weights = torch.nan_to_num(torch.exp(old - rollout)).clamp(max=2.0)
    row_loss, _ = gmpo(old, old, adv, mask, is_weights_BT=weights)
    assert torch.allclose(row_loss, t([-1, -1, 0], [0.5, 0, 0.5]), atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_gmpo_with_rollout_is_matches_verl_with_interior_gaps(seed, level):
    logp, old, adv, mask = _random(seed)
    g = torch.Generator().manual_seed(100 + seed)
    mask = mask * (torch.rand(mask.shape, generator=g) > 0.3).float()  # observation spans inside responses
    mask[:, 0] = 1.0
    rollout = old + 0.5 * torch.randn(old.shape, generator=g)
    out = {"logprobs": logp.clone().requires_grad_(True)}
    correction = RolloutCorrectionConfig(is_level=level, is_threshold=2.0).build()
    loss, _ = gmpo_loss(rollout_correction=correction)(out, gmpo_mb(old, rollout, adv, mask))
    ref_logp = logp.clone().requires_grad_(True)
    weights = verl.rollout_is_weights(old - rollout, mask, level, 2.0)
    expected = verl.geo_mean(old, ref_logp, adv, mask, 0.4, 0.4, rollout_is_weights=weights)
    assert torch.allclose(loss, expected, atol=1e-6)
    loss.backward()
    expected.backward()
    assert torch.allclose(out["logprobs"].grad, ref_logp.grad, atol=1e-6)


def test_token_covariance():
    # A [1, -1, 0], logp [-1, -3, -2]: means 0 and -2 -> [1, 1, 0]
    assert torch.equal(token_covariance(t(1.0, -1.0, 0.0), t(-1.0, -3.0, -2.0), ONES), t(1.0, 1.0, 0.0))


def test_kl_cov_penalises_the_top_covariance_tokens():
    # logp [-1, -2.5, -2] (mean -11/6), A [1, -1, 0]: cov [5/6, 2/3, 0] -> with ratio .5, 1 token: token 0
    # old [-1.5, -2.5, -2]: r = [e^.5, 1, 1]; loss -A r + .1 |log r| on token 0 -> [-e^.5 + .05, 1, 0]
    logp = t(-1.0, -2.5, -2.0)
    loss, metrics = kl_cov(logp, t(-1.5, -2.5, -2.0), t(1.0, -1.0, 0.0), ONES, kl_cov_ratio=0.5)
    assert torch.allclose(loss, t(-math.exp(0.5) + 0.05, 1.0, 0.0))
    assert metrics["cov_klfrac"] == pytest.approx(1 / 3)


def test_clip_cov_detaches_high_covariance_tokens():
    logp, adv = t(-1.0, -3.0, -2.0), t(1.0, -1.0, 0.0)  # cov [1, 1, 0], r = 1
    # default bounds (1, 5): cov 1 is not inside -> PPO's loss [-1, 1, 0]
    loss, metrics = clip_cov(logp, logp.clone(), adv, ONES)
    assert torch.equal(loss, t(-1.0, 1.0, 0.0)) and metrics["cov_clipfrac"] == 0.0
    # bounds (.5, 5), ratio 1: both candidates dropped; ratio .5: max(1, int(1.5)) = 1 of the 2, at random
    loss, metrics = clip_cov(logp, logp.clone(), adv, ONES, cov_lb=0.5, cov_ratio=1.0)
    assert torch.equal(loss, t(0.0, 0.0, 0.0)) and metrics["cov_clipfrac"] == pytest.approx(2 / 3)
    x = leaf(logp)
    loss, metrics = clip_cov(x, logp.clone(), adv, ONES, cov_lb=0.5, cov_ratio=0.5,
                             generator=torch.Generator().manual_seed(0))
    loss.sum().backward()
    assert metrics["cov_clipfrac"] == pytest.approx(1 / 3)
    assert sorted(x.grad[:2].tolist()) == [-1.0, 0.0] or sorted(x.grad[:2].tolist()) == [0.0, 1.0]


def _random(seed):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(9) < torch.randint(1, 10, (6,), generator=g).unsqueeze(-1)).float()
    logp = -torch.rand(6, 9, generator=g) * 2
    old = logp + 0.3 * torch.randn(6, 9, generator=g)
    seq_adv = torch.randn(6, 1, generator=g).expand(6, 9).clone()
    return logp, old, seq_adv, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_losses_match_verl_on_random_inputs(seed):
    logp, old, adv, mask = _random(seed)
    sapo_loss, _ = sapo(logp, old, adv, mask)
    assert torch.allclose(agg_loss(sapo_loss, mask, "seq-mean-token-mean"),
                          verl.seq_mean_token_mean(verl.sapo_tokens(old, logp, adv), mask), atol=1e-6)
    gm, _ = gmpo(logp, old, adv, mask)
    assert torch.allclose(agg_loss(gm, mask, "seq-mean-token-mean"), verl.geo_mean(old, logp, adv, mask, 0.4, 0.4),
                          atol=1e-6)
    token_adv = torch.randn(6, 9, generator=torch.Generator().manual_seed(seed))
    kc, _ = kl_cov(logp, old, token_adv, mask, kl_cov_ratio=0.1)
    assert torch.allclose(kc, verl.kl_cov_tokens(old, logp, token_adv, mask, 0.1, 0.1) * mask, atol=1e-6)
    cc, _ = clip_cov(logp, old, token_adv, mask, cov_ratio=0.05, cov_lb=0.0, cov_ub=5.0,
                     generator=torch.Generator().manual_seed(seed))
    expected = verl.clip_cov_tokens(old, logp, token_adv, mask, 0.2, 0.05, 0.0, 5.0, torch.Generator().manual_seed(seed))
    assert torch.allclose(cc, expected * mask, atol=1e-6)


def test_pf_ppo_weights_and_resampling():
    scores = t(1.0, -2.0, 0.5)
    assert torch.allclose(pf_ppo_weights(scores, "pow", 2.0), t(1.0, 4.0, 0.25))
    assert torch.allclose(pf_ppo_weights(scores, "max_min"), t(1.0, 1.0, 0.0), atol=1e-7)
    assert torch.allclose(pf_ppo_weights(scores, "max_random"), t(0.4, 0.1, 0.1))
    for method in ("pow", "max_min", "max_random"):
        assert torch.equal(pf_ppo_weights(scores, method, 1.5), verl.pf_ppo_weights(scores, method, 1.5))
    rows = pf_ppo_resample(scores, "max_min", generator=torch.Generator().manual_seed(0))
    assert rows.shape == (3,) and set(rows.tolist()) <= {0, 1}  # the middle row has weight 1e-8
    with pytest.raises(ValueError, match="reweight_method"):
        pf_ppo_weights(scores, "median")
