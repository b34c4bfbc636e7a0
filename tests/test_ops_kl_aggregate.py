"""Masked reductions, loss aggregation and KL estimators on tiny tensors."""

import math

import pytest
import torch

from flowrl.rl.ops.aggregate import AGG_MODES, SUM_MODES, agg_loss, agg_weight
from flowrl.rl.ops.kl import adaptive_kl_coef, kl_penalty
from flowrl.rl.ops.masked import masked_mean, masked_sum, masked_var, masked_whiten

NAN = float("nan")


def t(*rows):
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.float32)


# ---------------------------------------------------------------- masked ops


def test_masked_sum_and_mean_ignore_padding_garbage():
    mask = t(1, 1, 0)
    for pad in (9.0, NAN, float("inf")):
        x = t(1, 2, pad)
        assert masked_sum(x, mask).item() == 3.0  # 1 + 2
        assert masked_mean(x, mask).item() == 1.5  # (1 + 2) / 2
    assert masked_mean(x, mask.bool()).item() == 1.5  # bool masks too


def test_masked_mean_along_dim_gives_zero_for_empty_rows():
    x = t([1, 2, 9], [4, 0, 0], [7, 7, 7])
    mask = t([1, 1, 0], [1, 0, 0], [0, 0, 0])
    # rows: (1 + 2) / 2 = 1.5; 4 / 1 = 4; no valid token -> 0
    assert torch.allclose(masked_mean(x, mask, dim=-1), t(1.5, 4.0, 0.0))
    assert torch.allclose(masked_sum(x, mask, dim=-1), t(3.0, 4.0, 0.0))


def test_masked_var_biased_and_unbiased():
    x, mask = t(1, 2, 3, 100), t(1, 1, 1, 0)
    # mean 2, squared deviations 1, 0, 1: biased 2/3, unbiased 2/3 * 3/2 = 1
    assert masked_var(x, mask).item() == pytest.approx(1.0)
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(2 / 3)
    # one valid entry: biased variance 0 instead of verl's NaN
    assert masked_var(t(5, 1, 1), t(1, 0, 0)).item() == 0.0
    with pytest.raises(ValueError, match="mask"):
        masked_var(x, torch.zeros(4))


def test_masked_whiten():
    x, mask = t(1, 2, 3, NAN), t(1, 1, 1, 0)
    # mean 2, var 1 -> (x - 2) / 1 = [-1, 0, 1], padding 0
    assert torch.allclose(masked_whiten(x, mask), t(-1, 0, 1, 0))
    # shift_mean=False adds the mean back: [1, 2, 3]
    assert torch.allclose(masked_whiten(x, mask, shift_mean=False), t(1, 2, 3, 0))


# ---------------------------------------------------------------- aggregation

LOSS = t([1, 2, 3], [4, 5, 6])
MASK = t([1, 1, 0], [1, 0, 0])


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
    ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2 rows
    ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2 rows
    ("seq-mean-token-sum-norm", 7 / 6),  # 7 / (2 rows * T=3)
    ("token-sum", 7.0),  # 1 + 2 + 4
])
def test_agg_loss_modes(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)
    # an all-padding row with garbage changes nothing, in value or in weight
    loss = torch.cat([LOSS, t([[NAN, 1e9, 3]])])
    mask = torch.cat([MASK, torch.zeros(1, 3)])
    assert agg_loss(loss, mask, mode).item() == pytest.approx(expected)
    assert agg_weight(mask, mode) == agg_weight(MASK, mode)


def test_agg_loss_norm_len_and_weights():
    # Dr.GRPO with norm_len 7: 7 / (2 * 7) = 0.5
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_len=7).item() == pytest.approx(0.5)
    assert agg_weight(MASK, "token-mean") == 3.0  # valid tokens
    assert agg_weight(MASK, "seq-mean-token-mean") == 2.0  # rows
    # nothing valid: loss 0, weight 0
    for mode in AGG_MODES:
        assert agg_loss(LOSS, torch.zeros(2, 3), mode).item() == 0.0
        assert agg_weight(torch.zeros(2, 3), mode) == 0.0


def test_agg_bad_mode_and_norm_len():
    with pytest.raises(ValueError, match="loss_agg_mode.*token-mean"):
        agg_loss(LOSS, MASK, "seq-sum")
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_weight(MASK, "seq-sum")
    with pytest.raises(ValueError, match="norm_len"):
        agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_len=0)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_agg_weight_recombines_split_batch_exactly(mode):
    loss = t([1, 2, 3], [4, 5, 6], [7, 8, 9], [2, 2, 2])
    mask = t([1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0])
    # token-mean by hand: whole (1+2+3+4+7+8) / 6 = 25/6;
    # halves 10/4 (w 4) and 15/2 (w 2) -> (10 + 15) / 6
    # token-sum: the halves' sums add up (weight 1 each, not normalised): 10 + 15
    halves = [(loss[:2], mask[:2]), (loss[2:], mask[2:])]
    weights = [agg_weight(m, mode) for _, m in halves]
    combined = sum(agg_loss(x, m, mode) * w for (x, m), w in zip(halves, weights))
    combined = combined if mode in SUM_MODES else combined / sum(weights)
    assert combined.item() == pytest.approx(agg_loss(loss, mask, mode).item())
    if mode == "token-mean":
        assert combined.item() == pytest.approx(25 / 6)


# ---------------------------------------------------------------- KL

LOGP = t(-1.0, -2.0, -0.5)
REF = t(-1.5, -1.0, -0.5)


@pytest.mark.parametrize("kinds, expected", [
    (("k1", "kl"), [0.5, -1.0, 0.0]),  # logp - ref
    (("abs",), [0.5, 1.0, 0.0]),
    (("k2", "mse"), [0.125, 0.5, 0.0]),  # 0.5 * [0.25, 1, 0]
    # d = ref - logp = [-0.5, 1, 0]; e^d - d - 1 = [.60653 + .5 - 1, 2.71828 - 2, 0]
    (("k3", "low_var_kl"), [0.106531, 0.718282, 0.0]),
])
def test_kl_penalty_kinds(kinds, expected):
    for kind in kinds:
        assert torch.allclose(kl_penalty(LOGP, REF, kind), t(*expected), atol=1e-6)


def test_k3_is_clamped_and_nonnegative():
    # d = 15 - 0: e^15 - 16 is huge -> clamped to 10
    assert kl_penalty(t(0.0), t(15.0), "k3").item() == 10.0
    # d = -30 -> clamped to -20: e^-20 + 20 - 1 = 19 -> clamped to 10
    assert kl_penalty(t(30.0), t(0.0), "k3").item() == 10.0
    assert math.isclose(kl_penalty(t(0.0), t(0.0), "k3").item(), 0.0)


def test_kl_bad_kind():
    with pytest.raises(ValueError, match="kl_kind"):
        kl_penalty(LOGP, REF, "k4")


@pytest.mark.parametrize("kind, expected", [
    ("k1+", [0.5, -1.0, 0.0]), ("abs+", [0.5, 1.0, 0.0]), ("k2+", [0.125, 0.5, 0.0]),
    ("k3+", [0.106531, 0.718282, 0.0]), ("low_var_kl+", [0.106531, 0.718282, 0.0]),
])
def test_straight_through_kl_has_the_base_value_and_k2_gradient(kind, expected):
    logp = LOGP.clone().requires_grad_(True)
    value = kl_penalty(logp, REF, kind)
    assert torch.allclose(value, t(*expected), atol=1e-6)
    value.sum().backward()
    # k2's gradient: logp - ref = [.5, -1, 0] (k1's would be [1, 1, 1])
    assert torch.allclose(logp.grad, t(0.5, -1.0, 0.0))


def test_straight_through_kl_matches_verl_on_random_inputs():
    import verl_reference as verl

    g = torch.Generator().manual_seed(0)
    logp, ref = -torch.rand(4, 5, generator=g) * 3, -torch.rand(4, 5, generator=g) * 3
    for base in ("k1", "abs", "k2", "k3"):
        ours, theirs = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
        a, b = kl_penalty(ours, ref, base + "+"), verl.kl_straight_through(theirs, ref, base)
        (a * ref).sum().backward()
        (b * ref).sum().backward()
        assert torch.allclose(a, b, atol=1e-6) and torch.allclose(ours.grad, theirs.grad, atol=1e-6)


def test_adaptive_kl_coef():
    # above target: error .15 / .1 - 1 = .5, clipped to .2; 4 rows / horizon 8 -> .1 * (1 + .2 * .5) = .11
    assert adaptive_kl_coef(0.1, 0.15, 0.1, horizon=8, num_steps=4) == pytest.approx(0.11)
    # below: .05 / .1 - 1 = -.5 -> -.2 -> .1 * (1 - .1) = .09; on target: unchanged
    assert adaptive_kl_coef(0.1, 0.05, 0.1, horizon=8, num_steps=4) == pytest.approx(0.09)
    assert adaptive_kl_coef(0.1, 0.1, 0.1, horizon=8, num_steps=4) == pytest.approx(0.1)
    # inside the clip: .11 / .1 - 1 = .1; 2 rows / horizon 4 -> 1.05
    assert adaptive_kl_coef(0.2, 0.11, 0.1, horizon=4, num_steps=2) == pytest.approx(0.21)
    with pytest.raises(ValueError, match="horizon"):
        adaptive_kl_coef(0.1, 0.1, 0.1, horizon=0, num_steps=1)
    with pytest.raises(ValueError, match="target_kl"):
        adaptive_kl_coef(0.1, 0.1, 0.0, horizon=1, num_steps=1)
