"""Policy objectives, entropy and the clipped value loss on tiny tensors."""

import math

import pytest
import torch

from flowrl.rl.ops.aggregate import agg_loss
from flowrl.rl.ops.cov_loss import clip_cov, kl_cov
from flowrl.rl.ops.policy_gradient import gmpo, reinforce, sapo
from flowrl.rl.ops.policy_loss import cispo, dppo_kl, dppo_tv, gspo, ppo_clip
from flowrl.rl.ops.value_loss import clipped_value_loss

NAN = float("nan")


def t(*rows):
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.float32)


def leaf(x):
    return x.clone().requires_grad_(True)


# ratios r = [1.5, .5, 1.1] against old logprobs 0; advantages [1, -1, 1]
RATIO = t(1.5, 0.5, 1.1)
OLD = torch.zeros(3)
ADV = t(1.0, -1.0, 1.0)
ONES = torch.ones(3)


def test_ppo_clip_hand_values_and_metrics():
    logp = leaf(RATIO.log())
    loss, metrics = ppo_clip(logp, OLD, ADV, ONES)
    # tok0 A=1  r=1.5: max(-1.5, -1.2) = -1.2 (clipped)
    # tok1 A=-1 r=.5 : max(.5, .8)     = .8   (clipped)
    # tok2 A=1  r=1.1: max(-1.1, -1.1) = -1.1
    assert torch.allclose(loss, t(-1.2, 0.8, -1.1))
    assert metrics["clipfrac"] == pytest.approx(2 / 3)
    # approx_kl = mean(-log r) = -(.405465 - .693147 + .095310) / 3
    assert metrics["approx_kl"] == pytest.approx(0.064124, abs=1e-6)
    assert metrics["ratio_mean"] == pytest.approx(3.1 / 3)
    # gradient only through the unclipped token: d(-A r)/dlogp = -A r = -1.1
    loss.sum().backward()
    assert torch.allclose(logp.grad, t(0.0, 0.0, -1.1))


def test_clip_higher_raises_only_the_upper_bound():
    loss, _ = ppo_clip(RATIO.log(), OLD, ADV, ONES, clip_low=0.2, clip_high=0.28)
    # tok0: max(-1.5, -1.28) = -1.28; tok1 still clipped at 1 - .2 -> .8
    assert torch.allclose(loss, t(-1.28, 0.8, -1.1))


def test_dual_clip_caps_the_loss_of_negative_advantages():
    logp = leaf(t(math.log(5.0), math.log(5.0)))
    adv = t(-1.0, 1.0)
    # A=-1, r=5: max(5, 1.2) = 5 -> min(5, -A * c = 3) = 3, flat: no gradient
    # A=1,  r=5: max(-5, -1.2) = -1.2, the dual clip does not apply to A > 0
    loss, metrics = ppo_clip(logp, torch.zeros(2), adv, torch.ones(2), dual_clip=3.0)
    assert torch.allclose(loss, t(3.0, -1.2))
    assert metrics["clipfrac_lower"] == pytest.approx(0.5)
    loss.sum().backward()
    assert torch.allclose(logp.grad, torch.zeros(2))
    no_dual, metrics = ppo_clip(logp, torch.zeros(2), adv, torch.ones(2))
    assert torch.allclose(no_dual, t(5.0, -1.2)) and "clipfrac_lower" not in metrics


def test_ppo_log_ratio_is_clamped():
    # logp - old = 100 -> clamped to 20 -> r = e^20; A = -1, no dual clip
    loss, _ = ppo_clip(t(100.0).reshape(1), torch.zeros(1), -torch.ones(1), torch.ones(1))
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-5)


def test_bad_clip_arguments():
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip(RATIO.log(), OLD, ADV, ONES, dual_clip=1.0)
    with pytest.raises(ValueError, match="clip_low"):
        ppo_clip(RATIO.log(), OLD, ADV, ONES, clip_low=-0.1)
    with pytest.raises(ValueError, match="clip_high"):
        cispo(RATIO.log(), OLD, ADV, ONES, clip_high=-0.1)


@pytest.mark.parametrize("objective", [ppo_clip, gspo, cispo, dppo_tv, dppo_kl, reinforce, sapo, gmpo, clip_cov,
                                       kl_cov])
def test_padding_garbage_changes_nothing(objective):
    mask = t([1, 1, 0], [1, 0, 0])
    logp, old, adv = t([-0.5, -1.0, -2.0], [-0.3, -1.0, -1.0]), t([-0.6, -0.9, 0], [-0.2, 0, 0]), t([1, 1, 1], [-1, 0, 0])
    bad_logp, bad_old, bad_adv = logp.clone(), old.clone(), adv.clone()
    for x in (bad_logp, bad_old, bad_adv):
        x[~mask.bool()] = NAN
    clean, bad = leaf(logp), leaf(bad_logp)
    loss_a, metrics_a = objective(clean, old, adv, mask)
    loss_b, metrics_b = objective(bad, bad_old, bad_adv, mask)
    assert torch.equal(loss_a, loss_b) and metrics_a == metrics_b
    loss_a.sum().backward()
    loss_b.sum().backward()
    assert torch.equal(clean.grad, bad.grad)  # finite, and 0 on padding
    assert (clean.grad[~mask.bool()] == 0).all()


def test_gspo_gradient_is_the_sequence_ratio_gradient():
    mask = t([1, 1, 0], [1, 1, 1])
    old = t([-1.0, -1.0, 0.0], [-2.0, -2.0, -2.0])
    logp_init = old + t([0.2, -0.1, 0.0], [0.3, 0.3, 0.3])
    adv = t([1.0, 1.0, 1.0], [-1.0, -1.0, -1.0])  # sequence-level advantages
    # row 0: s = exp(mean(.2, -.1)) = exp(.05) = 1.051271; row 1: s = exp(.3) = 1.349859
    # seq-mean-token-mean: mean(-1 * 1.051271, +1 * 1.349859) = .149294
    # d/dlogp_t = -A_i s_i / |y_i| / B: row 0 -1.051271/2/2, row 1 1.349859/3/2
    logp = leaf(logp_init)
    loss_BT, metrics = gspo(logp, old, adv, mask, clip_low=10.0, clip_high=10.0)
    loss = agg_loss(loss_BT, mask, "seq-mean-token-mean")
    assert loss.item() == pytest.approx(0.149294, abs=1e-6)
    assert metrics["ratio_mean"] == pytest.approx((2 * 1.051271 + 3 * 1.349859) / 5, abs=1e-6)
    loss.backward()
    expected = t([-0.262818, -0.262818, 0.0], [0.224977, 0.224977, 0.224977])
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    # same as differentiating the sequence objective mean_i(-A_i * s_i) directly
    ref = leaf(logp_init)
    s_B = torch.exp(((ref - old) * mask).sum(-1) / mask.sum(-1))
    (-(adv[:, 0] * s_B)).mean().backward()
    assert torch.allclose(logp.grad, ref.grad, atol=1e-6)


def test_gspo_default_clip_is_tight():
    # s = exp(.05) = 1.0513 > 1 + 4e-4: clipped to 1.0004 for A = 1, no gradient
    logp = leaf(t([[0.2, -0.1]]))
    loss, metrics = gspo(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    assert torch.allclose(loss, t([[-1.0004, -1.0004]]))
    assert metrics["clipfrac"] == 1.0
    loss.sum().backward()
    assert torch.equal(logp.grad, torch.zeros(1, 2))


def test_cispo_clips_a_detached_weight():
    logp = leaf(RATIO.log())
    loss, metrics = cispo(logp, OLD, ADV, ONES)  # clip_low 10 (none), clip_high .2
    # weights sg(clip(r, -9, 1.2)) = [1.2, .5, 1.1]; loss = -w * A * logp:
    # [-1.2 * .405465, -.5 * -1 * -.693147, -1.1 * .095310]
    assert torch.allclose(loss, t(-0.486558, -0.346574, -0.104841), atol=1e-6)
    assert metrics["clipfrac"] == pytest.approx(1 / 3)
    # gradient -w * A, the clipped token included (PPO would give it 0)
    loss.sum().backward()
    assert torch.allclose(logp.grad, t(-1.2, 0.5, -1.1))


def test_clipped_value_loss():
    values, old, returns = t([1.0, 0.0, 2.0, NAN]), t([0.0, 0.0, 1.0, NAN]), t([2.0, 1.0, 1.0, NAN])
    mask = t([1, 1, 1, 0])
    # tok0: clip(1, -.5, .5) = .5: max((1-2)^2, (.5-2)^2) = 2.25 -> 1.125 (clipped)
    # tok1: max(1, 1) -> .5; tok2: clip(2, .5, 1.5) = 1.5: max(1, .25) = 1 -> .5
    loss, metrics = clipped_value_loss(values, old, returns, mask, clip=0.5)
    assert torch.allclose(loss, t(1.125, 0.5, 0.5, 0.0))
    assert metrics["vf_clipfrac"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="clip"):
        clipped_value_loss(values, old, returns, mask, clip=0.0)
