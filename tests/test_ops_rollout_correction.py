"""Rollout correction ops (verl's truncated IS, rejection, mismatch metrics) on tiny tensors."""

import math

import pytest
import torch

from flowrl.rl.ops.rollout_correction import (check_bounds, check_is_threshold, check_level, is_weight_metrics,
                                              level_log_ratio, log_ratio, masked_fraction, mismatch_metrics,
                                              rejection_keep_mask, truncated_is_weights)

NAN = float("nan")
ln = math.log


def t(*rows):
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.float32)


def test_log_ratio_is_old_minus_rollout_and_zero_on_padding():
    out = log_ratio(t(-1.0, -2.0, 9.0), t(-1.5, -1.0, NAN), t(1, 1, 0))
    # -1 - (-1.5) = .5; -2 - (-1) = -1; padding (NaN there) -> 0
    assert torch.equal(out, t(0.5, -1.0, 0.0))


@pytest.mark.parametrize("level, expected", [
    ("token", t([0.5, -1.0, 0.0], [0.2, 0.0, 0.0])),  # as given, 0 on padding
    ("sequence", t([-0.5, -0.5, 0.0], [0.2, 0.0, 0.0])),  # row sums .5 - 1 = -.5 and .2 (the 9s are padding)
    ("geometric", t([-0.25, -0.25, 0.0], [0.2, 0.0, 0.0])),  # row means -.5 / 2 = -.25 and .2 / 1
])
def test_level_log_ratio(level, expected):
    log_rho, mask = t([0.5, -1.0, 9.0], [0.2, 9.0, 9.0]), t([1, 1, 0], [1, 0, 0])
    assert torch.allclose(level_log_ratio(log_rho, mask, level), expected)


def test_token_truncated_is_weights_are_capped_detached_and_zero_on_padding():
    log_rho = t(ln(3.0), ln(0.5), 0.0).requires_grad_(True)
    weights = truncated_is_weights(log_rho, t(1, 1, 0), "token", threshold=2.0)
    # min(3, 2) = 2; min(.5, 2) = .5; padding 0
    assert torch.allclose(weights, t(2.0, 0.5, 0.0))
    assert not weights.requires_grad


def test_sequence_and_geometric_is_weights_share_one_weight_per_row():
    log_rho, mask = t([ln(1.5), ln(1.2), 7.0]), t([1, 1, 0])
    # sequence: 1.5 * 1.2 = 1.8 on each valid token; truncated at 1.5 -> 1.5
    assert torch.allclose(truncated_is_weights(log_rho, mask, "sequence", 2.0), t([1.8, 1.8, 0.0]))
    assert torch.allclose(truncated_is_weights(log_rho, mask, "sequence", 1.5), t([1.5, 1.5, 0.0]))
    # geometric: sqrt(1.5 * 1.2) = sqrt(1.8) = 1.341641
    assert torch.allclose(truncated_is_weights(log_rho, mask, "geometric", 2.0), t([1.341641, 1.341641, 0.0]))


def test_is_weights_clamp_the_log_ratio_at_20_before_exp():
    weights = truncated_is_weights(t(100.0, -100.0), t(1, 1), "token", threshold=1e10)
    # exp(min(100, 20)) = exp(20) = 4.85e8 (below the 1e10 cap); exp(-20) = 2.06e-9
    assert weights[0].item() == pytest.approx(math.exp(20.0), rel=1e-6)
    assert weights[1].item() == pytest.approx(math.exp(-20.0), rel=1e-6)


def test_token_rejection_keeps_ratios_inside_the_bounds():
    log_rho = t(ln(3.0), ln(0.6), ln(0.4))
    # upper 2, lower 1/2: 3 > 2 out; .5 <= .6 <= 2 in; .4 < .5 out
    assert rejection_keep_mask(log_rho, t(1, 1, 1), "token", upper=2.0).tolist() == [False, True, False]
    # lower .7: .6 < .7 now out too; ratio 1 stays in
    assert rejection_keep_mask(t(ln(3.0), ln(0.6), 0.0), t(1, 1, 1), "token", 2.0, 0.7).tolist() == [False, False,
                                                                                                      True]
    # bounds are inclusive: exp(0) = 1 is kept by [1, 1]; exp(+-.1) is not
    assert rejection_keep_mask(t(0.0, 0.1, -0.1), t(1, 1, 1), "token", 1.0, 1.0).tolist() == [True, False, False]


@pytest.mark.parametrize("level, expected", [
    ("token", [[True, True, False], [False, True, False]]),  # 1.5, 1.5 in; 3 out, .6 in; padding False
    ("sequence", [[False, False, False], [True, True, False]]),  # 1.5 * 1.5 = 2.25 > 2 out; 3 * .6 = 1.8 in
    ("geometric", [[True, True, False], [True, True, False]]),  # sqrt(2.25) = 1.5 in; sqrt(1.8) = 1.342 in
])
def test_rejection_levels_drop_tokens_or_whole_rows(level, expected):
    log_rho, mask = t([ln(1.5), ln(1.5), NAN], [ln(3.0), ln(0.6), NAN]), t([1, 1, 0], [1, 1, 0])
    assert rejection_keep_mask(log_rho, mask, level, upper=2.0).tolist() == expected


def test_masked_fraction_counts_dropped_valid_tokens():
    keep, mask = torch.tensor([[True, False, False]]), t([[1, 1, 0]])
    # 1 of the 2 valid tokens dropped; the padding one is not counted
    assert masked_fraction(keep, mask) == pytest.approx(0.5)


def test_mismatch_metrics_k1_k3_and_max_abs_difference():
    old, rollout, mask = t(-1.0, -2.0, 0.0), t(-1.5, -1.0, 5.0), t(1, 1, 0)
    metrics = mismatch_metrics(old, rollout, mask)
    # log rho = old - rollout = [.5, -1]; k1 kl = mean(rollout - old) = (-.5 + 1) / 2 = .25
    assert metrics["kl"] == pytest.approx(0.25)
    # k3 = mean(rho - log rho - 1) = ((e^.5 - 1.5) + (e^-1 + 1 - 1)) / 2 = (.148721 + .367879) / 2 = .258300
    assert metrics["k3_kl"] == pytest.approx(0.258300, abs=1e-6)
    # max |old - rollout| = max(.5, 1) = 1; the padding's |0 - 5| is ignored
    assert metrics["max_abs_diff"] == pytest.approx(1.0)


def test_mismatch_metrics_ignore_padding_garbage_and_are_zero_when_equal():
    old = t([-1.0, -2.0, NAN])
    assert mismatch_metrics(old, t([-1.0, -2.0, 7.0]), t([1, 1, 0])) == {"kl": 0.0, "k3_kl": 0.0, "max_abs_diff": 0.0}


def test_is_weight_metrics_mean_and_truncated_fraction():
    log_rho, mask = t(ln(3.0), ln(0.5), 0.0), t(1, 1, 0)
    weights = truncated_is_weights(log_rho, mask, "token", 2.0)  # [2, .5, 0]
    metrics = is_weight_metrics(weights, log_rho, mask, "token", 2.0)
    # mean weight (2 + .5) / 2 = 1.25; 1 of 2 valid ratios (3) above 2
    assert metrics == pytest.approx({"is_weight_mean": 1.25, "is_truncated_fraction": 0.5})


@pytest.mark.parametrize("call, name", [
    (lambda: check_level("seq", "is_level"), "is_level"),
    (lambda: level_log_ratio(t(0.0), t(1), "tokens"), "level"),
    (lambda: check_is_threshold(0.0, "is_threshold"), "is_threshold"),
    (lambda: truncated_is_weights(t(0.0), t(1), "token", -1.0), "threshold"),
    (lambda: check_bounds(-2.0), "upper"),
    (lambda: check_bounds(2.0, 3.0), "lower"),  # lower above upper
    (lambda: check_bounds(0.5), "lower"),  # default lower 1 / .5 = 2 above upper .5
    (lambda: rejection_keep_mask(t(0.0), t(1), "token", 2.0, 0.0), "lower"),
])
def test_bad_arguments_raise_naming_them(call, name):
    with pytest.raises(ValueError, match=name):
        call()
