"""DPPO's trust-region objectives (binary TV and binary KL) on 3-4 token tensors."""

import math

import pytest
import torch

from flowrl.rl.ops.policy_loss import binary_kl, cispo, dppo_kl, dppo_tv


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def leaf(x):
    return x.clone().requires_grad_(True)


def probs(*p):
    return t(*p).log()


def test_binary_kl_hand_values():
    # q = .5, p = .25: .5 ln(.5/.25) + .5 ln(.5/.75) = .346574 - .202733 = .143841
    # p = q: 0; q = exp(-200) = 0 (underflow), p = exp(-1): 0 + ln(1 / (1 - .367879)) = .458675, not NaN
    d = binary_kl(t(math.log(0.25), -0.7, -1.0), t(math.log(0.5), -0.7, -200.0))
    assert torch.allclose(d, t(0.143841, 0.0, 0.458675), atol=1e-6)


def test_dppo_tv_masks_by_probability_difference_not_ratio():
    # tok0 A=1  q=.5 p=.7: p - q = .2  > .15  -> masked (r = 1.4)
    # tok1 A=1  q=.2 p=.3: p - q = .1 <= .15  -> kept, though r = 1.5 (PPO would clip at 1.2)
    # tok2 A=-1 q=.5 p=.3: p - q = -.2 < -.15 -> masked (r = .6)
    old, adv = probs(0.5, 0.2, 0.5), t(1.0, 1.0, -1.0)
    logp = leaf(probs(0.7, 0.3, 0.3))
    loss, metrics = dppo_tv(logp, old, adv, torch.ones(3))
    # kept: -A * sg(r) * logp = -1.5 * ln .3 = 1.805959
    assert torch.allclose(loss, t(0.0, 1.805959, 0.0), atol=1e-6)
    assert metrics["clipfrac"] == pytest.approx(2 / 3)
    assert metrics["ratio_mean"] == pytest.approx(3.5 / 3, abs=1e-6)  # (1.4 + 1.5 + .6) / 3
    # approx_kl = -(ln 1.4 + ln 1.5 + ln .6) / 3 = -(.336472 + .405465 - .510826) / 3
    assert metrics["approx_kl"] == pytest.approx(-0.077037, abs=1e-6)
    assert metrics["truncfrac"] == 0.0
    # masked tokens: no gradient; kept: -A * sg(r) * dlogp = -1.5
    loss.sum().backward()
    assert torch.allclose(logp.grad, t(0.0, -1.5, 0.0))


def test_dppo_tv_keeps_moves_back_into_the_region():
    # tok0 A=-1 q=.5 p=.6: p - q = .1 >= -.15 -> kept (pushing p down is allowed), r = 1.2
    # tok1 A=0  q=.5 p=.3: A <= 0 side, -.2 < -.15 -> masked
    # tok2 A=1  q=.5 p=.1: p - q = -.4 <= .15 -> kept, r = .2
    old, adv = probs(0.5, 0.5, 0.5), t(-1.0, 0.0, 1.0)
    logp = leaf(probs(0.6, 0.3, 0.1))
    loss, metrics = dppo_tv(logp, old, adv, torch.ones(3))
    # tok0: 1.2 * ln .6 = -.612991; tok2: -.2 * ln .1 = .460517
    assert torch.allclose(loss, t(-0.612991, 0.0, 0.460517), atol=1e-6)
    assert metrics["clipfrac"] == pytest.approx(1 / 3)
    loss.sum().backward()
    assert torch.allclose(logp.grad, t(1.2, 0.0, -0.2))


def test_dppo_ratio_cap_truncates_the_detached_weight():
    # the kept token of the first test, r = 1.5, capped at 1.2: -1.2 * ln .3 = 1.444768, grad -1.2
    logp = leaf(probs(0.7, 0.3, 0.3))
    loss, metrics = dppo_tv(logp, probs(0.5, 0.2, 0.5), t(1.0, 1.0, -1.0), torch.ones(3), ratio_cap=1.2)
    assert torch.allclose(loss, t(0.0, 1.444768, 0.0), atol=1e-6)
    assert metrics["truncfrac"] == pytest.approx(1 / 3)  # tok0 (r = 1.4) is masked, so not counted
    loss.sum().backward()
    assert torch.allclose(logp.grad, t(0.0, -1.2, 0.0))


def test_dppo_kl_masks_by_binary_kl_in_the_direction_of_the_update():
    # tok0 A=1  q=.5 p=.7: d = .5 ln(.5/.7) + .5 ln(.5/.3) = .087177 <= .15 -> kept (TV masks it), r = 1.4
    # tok1 A=1  q=.2 p=.6: d = .2 ln(.2/.6) + .8 ln(.8/.4) = .334795 > .15, p > q -> masked
    # tok2 A=-1 q=.5 p=.9: d = .510826 > .15 but p >= q -> kept, r = 1.8
    # tok3 A=-1 q=.5 p=.1: d = .5 ln 5 + .5 ln(.5/.9) = .510826 > .15, p < q -> masked
    old, adv = probs(0.5, 0.2, 0.5, 0.5), t(1.0, 1.0, -1.0, -1.0)
    logp = leaf(probs(0.7, 0.6, 0.9, 0.1))
    loss, metrics = dppo_kl(logp, old, adv, torch.ones(4))
    # tok0: -1.4 * ln .7 = .499345; tok2: 1.8 * ln .9 = -.189649
    assert torch.allclose(loss, t(0.499345, 0.0, -0.189649, 0.0), atol=1e-6)
    assert metrics["clipfrac"] == pytest.approx(0.5)
    loss.sum().backward()
    assert torch.allclose(logp.grad, t(-1.4, 0.0, 1.8, 0.0))
    tv, _ = dppo_tv(logp, old, adv, torch.ones(4))
    assert tv[0] == 0.0  # p - q = .2 > .15


def test_dppo_with_an_open_region_is_uncapped_cispo():
    # |p - q| <= 1 always: a TV bound of 1 keeps every token, so the loss is -A * sg(r) * logp
    old, logp, adv = probs(0.5, 0.2, 0.5), probs(0.7, 0.3, 0.3), t(1.0, 1.0, -1.0)
    loss, metrics = dppo_tv(logp, old, adv, torch.ones(3), clip_low=1.0, clip_high=1.0)
    expected, _ = cispo(logp, old, adv, torch.ones(3), clip_low=10.0, clip_high=10.0)
    assert torch.allclose(loss, expected) and metrics["clipfrac"] == 0.0


def test_dppo_on_policy_gradient_is_the_policy_gradient():
    # logp = old: r = 1, every token kept, gradient -A
    logp = leaf(probs(0.5, 0.2, 0.9))
    for objective in (dppo_tv, dppo_kl):
        logp.grad = None
        loss, metrics = objective(logp, logp.detach(), t(1.0, -2.0, 0.5), torch.ones(3))
        loss.sum().backward()
        assert torch.allclose(logp.grad, t(-1.0, 2.0, -0.5)) and metrics["clipfrac"] == 0.0


@pytest.mark.parametrize("objective", [dppo_tv, dppo_kl])
@pytest.mark.parametrize("kwargs, name", [({"clip_low": -0.1}, "clip_low"), ({"clip_high": -0.1}, "clip_high"),
                                          ({"ratio_cap": 0.5}, "ratio_cap")])
def test_bad_dppo_arguments(objective, kwargs, name):
    with pytest.raises(ValueError, match=name):
        objective(torch.zeros(3), torch.zeros(3), torch.ones(3), torch.ones(3), **kwargs)
