"""verl's other rollout corrections: k2 / k3 rejection (token, and per row by sum, mean and max), IcePop's
lower / upper IS thresholds and batch-normalised IS weights, against tests/verl_reference.py's transcriptions
of rollout_corr_helper.py (verl v0.9.0 = 1dda039).

verl's compute_rollout_rejection_mask:

    token_k2: torch.Tensor = 0.5 * log_ratio_safe**2
    token_k3: torch.Tensor = torch.exp(log_ratio_safe) - 1.0 - log_ratio_safe
    ...
        elif option_name == "token_k3":
            per_token_stat = token_k3
            token_keep_bool = per_token_stat <= upper_value

and compute_rollout_correction_weights:

        token_kept_mask = (raw_rollout_is_weights >= rollout_is_threshold_lower) & (
            raw_rollout_is_weights <= rollout_is_threshold_upper
        )
    ...
        if weights_mean > 1e-8:
            rollout_is_weights = rollout_is_weights / weights_mean
"""

import math
import warnings

import pytest
import torch
from pydantic import ValidationError
from tensordict import TensorDict

import verl_reference as verl
from flowrl.rl.correction import RolloutCorrection, RolloutCorrectionConfig
from flowrl.rl.losses import ppo_loss
from flowrl.rl.ops.rollout_correction import rejection_keep_mask, token_divergence, truncated_is_weights

ln = math.log
LEVEL_OF = {"token": "token", "seq_sum": "sequence", "seq_mean": "geometric", "seq_max": "max"}


def t(*rows):
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.float32)


def random_log_ratio(seed, rows=6, width=8):
    """Log ratios with padding and interior mask gaps, NaN garbage on padding."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=g) > 0.3).float()
    mask[:, 0] = 1.0
    mask[1, 4:] = 0.0
    log_rho = 0.6 * torch.randn(rows, width, generator=g)
    return log_rho, mask


def test_k2_and_k3_by_hand():
    # l = ln 2, 0, ln 3: k2 = l^2 / 2 = [.240227, 0, .603474]; k3 = rho - 1 - l = [.306853, 0, .901388]
    log_rho = t(ln(2.0), 0.0, ln(3.0))
    assert torch.allclose(token_divergence(log_rho, "k2"), t(0.240227, 0.0, 0.603474), atol=1e-6)
    assert torch.allclose(token_divergence(log_rho, "k3"), t(0.306853, 0.0, 0.901388), atol=1e-6)
    mask = t(1, 1, 1)
    assert rejection_keep_mask(log_rho, mask, "token", 0.5, estimator="k3").tolist() == [True, True, False]
    # rows: sum of k3 1.208241 > 1 (dropped), mean .402747 <= .5 (kept), max .901388 > .5 (dropped)
    assert not rejection_keep_mask(log_rho, mask, "sequence", 1.0, estimator="k3").any()
    assert rejection_keep_mask(log_rho, mask, "geometric", 0.5, estimator="k3").all()
    assert not rejection_keep_mask(log_rho, mask, "max", 0.5, estimator="k3").any()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("option, upper", [("token_k2", 0.1), ("token_k3", 0.1), ("seq_sum_k2", 0.6),
                                           ("seq_sum_k3", 0.8), ("seq_mean_k2", 0.15), ("seq_mean_k3", 0.15),
                                           ("seq_max_k2", 0.5), ("seq_max_k3", 0.7), ("token_k1", 1.5),
                                           ("seq_sum_k1", 2.0), ("seq_mean_k1", 1.3)])
def test_rejection_equals_verls_on_random_inputs(seed, option, upper):
    log_rho, mask = random_log_ratio(seed)
    expected = verl.rollout_rejection_mask(log_rho, mask, option, upper).bool()
    assert 0 < expected.sum() < mask.sum() or seed  # the first seed rejects some and keeps some
    garbage = torch.where(mask.bool(), log_rho, float("nan"))
    keep = rejection_keep_mask(garbage, mask, LEVEL_OF[option[:-3]], upper, estimator=option[-2:])
    assert torch.equal(keep, expected)


def test_icepop_and_batch_normalisation_by_hand():
    log_rho, mask = t(ln(3.0), ln(0.5), ln(1.5)), t(1, 1, 0)
    # IcePop [.6, 2]: 3 > 2 and .5 < .6 are zeroed; padding 0
    assert torch.allclose(truncated_is_weights(log_rho, mask, "token", 2.0, lower=0.6), t(0.0, 0.0, 0.0))
    # IcePop [.4, 2]: .5 kept untruncated
    assert torch.allclose(truncated_is_weights(log_rho, mask, "token", 2.0, lower=0.4), t(0.0, 0.5, 0.0))
    # TIS [2, .5] normalised by its mean 1.25 -> [1.6, .4]
    assert torch.allclose(truncated_is_weights(log_rho, mask, "token", 2.0, batch_normalize=True), t(1.6, 0.4, 0.0))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("lower, normalize", [(None, True), (0.5, False), (0.5, True)])
def test_is_weights_equal_verls_on_random_inputs(seed, level, lower, normalize):
    log_rho, mask = random_log_ratio(seed)
    upper = 1.8 if level == "token" else 3.0
    expected = verl.rollout_correction_weights(log_rho, mask, level, upper, lower, normalize)
    garbage = torch.where(mask.bool(), log_rho, float("nan"))
    weights = truncated_is_weights(garbage, mask, level, upper, lower, normalize)
    assert torch.allclose(weights, expected, atol=1e-6)


def test_the_loss_option_applies_them_and_logs_the_factor():
    log_rho, mask = random_log_ratio(0)
    mb = TensorDict({"old_logprobs": torch.zeros_like(mask), "rollout_logprobs": -log_rho,
                     "advantages": torch.ones_like(mask), "loss_mask": mask}, batch_size=[mask.shape[0]])
    correction = RolloutCorrectionConfig(is_level="token", is_threshold=1.8, rs_level="max", rs_threshold=0.5,
                                         is_threshold_lower=0.5, is_batch_normalize=True, rs_estimator="k3").build()
    loss, metrics = ppo_loss(rollout_correction=correction)({"logprobs": torch.zeros_like(mask)}, mb)
    weights = verl.rollout_correction_weights(log_rho, mask, "token", 1.8, 0.5, True)
    keep = verl.rollout_rejection_mask(log_rho, mask, "seq_max_k3", 0.5)
    # ratio 1, A = 1: each kept token's loss is -w; token-mean over every valid token
    assert loss.item() == pytest.approx((-(weights * keep).sum() / mask.sum()).item(), abs=1e-6)
    raw = verl.rollout_correction_weights(log_rho, mask, "token", 1.8, 0.5, False)
    assert metrics["rollout/is_batch_norm_factor"].item() == pytest.approx((raw.sum() / mask.sum()).item(), abs=1e-6)


def test_the_config_builds_them_and_refuses_bad_bounds():
    built = RolloutCorrectionConfig(is_level="sequence", is_threshold_lower=0.2, is_batch_normalize=True,
                                    rs_level="max", rs_estimator="k2", rs_threshold=0.01).build()
    assert built == RolloutCorrectionConfig(is_level="sequence", is_threshold=2.0, rs_level="max", rs_threshold=0.01,
                                            rs_threshold_lower=None, is_threshold_lower=0.2, is_batch_normalize=True,
                                            rs_estimator="k2").build()
    with pytest.raises(ValidationError, match="rs_estimator"):
        RolloutCorrectionConfig(rs_level="max", rs_estimator="k1")
    with pytest.raises(ValidationError, match="rs_threshold_lower"):
        RolloutCorrectionConfig(rs_level="token", rs_estimator="k3", rs_threshold=0.1, rs_threshold_lower=0.05)
    with pytest.raises(ValidationError, match="is_threshold_lower"):
        RolloutCorrectionConfig(is_level="token", is_threshold=2.0, is_threshold_lower=3.0)
    with pytest.warns(UserWarning, match="is_batch_normalize"):
        RolloutCorrectionConfig(is_batch_normalize=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RolloutCorrectionConfig(rs_level="token", rs_estimator="k3", rs_threshold=0.1)
