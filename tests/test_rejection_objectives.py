"""Rollout rejection reaches no objective: the rejected tokens are out of the loss mask every term reads, as
verl writes them out of response_mask before any loss runs; GMPO takes the IS weights inside by default.

verl (rollout_corr_helper.py, v0.9.0 = 1dda039), compute_rollout_correction_and_add_to_batch:

    # ALWAYS update response_mask with rejection applied
    batch.batch["response_mask"] = modified_response_mask

and compute_rollout_rejection_mask ends with

    modified_response_mask: torch.Tensor = (response_mask * final_mask).to(dtype=response_mask.dtype)

so GMPO's geometric mean, GSPO's sequence ratio and Clip-Cov's / KL-Cov's covariance are over kept tokens.
"""

from functools import partial

import pytest
import torch
from tensordict import TensorDict

import verl_reference as verl
from flowrl.rl.correction import RolloutCorrectionConfig
from flowrl.rl.loss_terms import Loss, PolicyTerm, policy_loss
from flowrl.rl.ops.cov_loss import clip_cov, kl_cov
from flowrl.rl.ops.policy_gradient import gmpo
from flowrl.rl.ops.policy_loss import gspo, ppo_clip


def random_batch(seed, rows=6, width=7, noise=0.5):
    """Random logprobs and sequence advantages; the mask has interior gaps (a tool observation) and padding."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=g) > 0.25).float()
    mask[:, 0] = 1.0
    mask[0, 5:] = 0.0
    old = -torch.rand(rows, width, generator=g) * 2
    logp = old + 0.3 * torch.randn(rows, width, generator=g)
    rollout = old + noise * torch.randn(rows, width, generator=g)
    adv = torch.randn(rows, 1, generator=g).expand(rows, width).clone()
    mb = TensorDict({"old_logprobs": old, "advantages": adv, "rollout_logprobs": rollout, "loss_mask": mask},
                    batch_size=[rows])
    return mb, logp


def kept_mask(mb, option, upper):
    return verl.rollout_rejection_mask(mb["old_logprobs"] - mb["rollout_logprobs"], mb["loss_mask"], option, upper)


def test_gmpo_row_means_are_over_kept_tokens_as_verls_geo_mean():
    # a row of 3 tokens, A = 1, logp - old = [.1, .2, 3] and rho = [1, 1, 10]: token rejection (upper 2)
    # drops the third; verl's row ratio is exp(mean(.1, .2)) = exp(.15), loss -1.161834, not exp(mean(.1, .2, .4))
    mb = TensorDict({"old_logprobs": torch.zeros(1, 3), "advantages": torch.ones(1, 3),
                     "rollout_logprobs": torch.tensor([[0.0, 0.0, -2.302585]]), "loss_mask": torch.ones(1, 3)},
                    batch_size=[1])
    loss_fn = Loss((PolicyTerm(partial(gmpo, clip_low=0.4, clip_high=0.4)),), "seq-mean-token-mean",
                   rollout_correction=RolloutCorrectionConfig(rs_level="token", rs_threshold=2.0).build())
    loss, _ = loss_fn({"logprobs": torch.tensor([[0.1, 0.2, 3.0]])}, mb)
    assert loss.item() == pytest.approx(-1.161834, abs=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_gmpo_with_token_rejection_equals_verl_and_rejected_tokens_get_no_gradient(seed):
    mb, logp = random_batch(seed)
    keep = kept_mask(mb, "token_k1", 1.5)
    assert 0 < keep.sum() < mb["loss_mask"].sum()
    correction = RolloutCorrectionConfig(is_level="token", is_threshold=2.0, rs_level="token", rs_threshold=1.5).build()
    loss_fn = policy_loss(partial(gmpo, clip_low=0.4, clip_high=0.4), loss_agg_mode="seq-mean-token-mean",
                         rollout_correction=correction)
    logp = logp.clone().requires_grad_(True)
    loss, _ = loss_fn({"logprobs": logp}, mb)
    weights = verl.rollout_is_weights(mb["old_logprobs"] - mb["rollout_logprobs"], mb["loss_mask"], "token", 2.0)
    expected = verl.geo_mean(mb["old_logprobs"], logp.detach(), mb["advantages"], keep, 0.4, 0.4, weights)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    loss.backward()
    rejected = mb["loss_mask"].bool() & ~keep.bool()
    assert logp.grad[rejected].abs().max() == 0 and logp.grad[keep.bool()].abs().max() > 0


@pytest.mark.parametrize("seed", range(4))
def test_gspo_with_token_rejection_equals_verl(seed):
    mb, logp = random_batch(seed)
    keep = kept_mask(mb, "token_k1", 1.5)
    loss_fn = policy_loss(partial(gspo, clip_low=0.2, clip_high=0.3), loss_agg_mode="seq-mean-token-mean",
                         rollout_correction=RolloutCorrectionConfig(rs_level="token", rs_threshold=1.5).build())
    loss, _ = loss_fn({"logprobs": logp}, mb)
    expected = verl.gspo(mb["old_logprobs"], logp, mb["advantages"], keep, 0.2, 0.3)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_clip_cov_and_kl_cov_with_sequence_rejection_take_their_covariance_over_kept_rows(seed):
    mb, logp = random_batch(seed, rows=8, noise=0.5)
    keep = kept_mask(mb, "seq_sum_k1", 2.0)
    assert 0 < keep.sum() < mb["loss_mask"].sum()
    correction = RolloutCorrectionConfig(rs_level="sequence", rs_threshold=2.0).build()
    num_valid = mb["loss_mask"].sum()  # flowrl's token-mean counts rejected tokens (verl's bypass-mode count)
    kl = policy_loss(partial(kl_cov, kl_cov_ratio=0.2, kl_coef=0.5), rollout_correction=correction)
    tokens = verl.kl_cov_tokens(mb["old_logprobs"], logp, mb["advantages"], keep, 0.2, 0.5)
    assert kl({"logprobs": logp}, mb)[0].item() == pytest.approx(((tokens * keep).sum() / num_valid).item(), abs=1e-6)
    clip = policy_loss(partial(clip_cov, cov_ratio=0.3, cov_lb=-5.0, cov_ub=5.0,
                              generator=torch.Generator().manual_seed(7)), rollout_correction=correction)
    tokens = verl.clip_cov_tokens(mb["old_logprobs"], logp, mb["advantages"], keep, 0.2, 0.3, -5.0, 5.0,
                                  torch.Generator().manual_seed(7))
    assert clip({"logprobs": logp}, mb)[0].item() == pytest.approx(((tokens * keep).sum() / num_valid).item(),
                                                                   abs=1e-6)


def test_without_rejection_a_loss_is_unchanged():
    mb, logp = random_batch(0)
    plain = policy_loss(partial(ppo_clip))({"logprobs": logp}, mb)[0]
    metrics_only = RolloutCorrectionConfig(log_mismatch=True).build()
    metrics_only = policy_loss(partial(ppo_clip), rollout_correction=metrics_only)({"logprobs": logp}, mb)[0]
    assert torch.equal(plain, metrics_only)


def test_a_hand_built_gmpo_loss_takes_the_weights_inside_by_default():
    mb, logp = random_batch(1)
    correction = RolloutCorrectionConfig(is_level="token", is_threshold=1.2).build()
    by_hand = policy_loss(partial(gmpo, clip_low=0.4, clip_high=0.4), loss_agg_mode="seq-mean-token-mean",
                         rollout_correction=correction)
    weights = verl.rollout_is_weights(mb["old_logprobs"] - mb["rollout_logprobs"], mb["loss_mask"], "token", 1.2)
    expected = verl.geo_mean(mb["old_logprobs"], logp, mb["advantages"], mb["loss_mask"], 0.4, 0.4, weights)
    assert by_hand({"logprobs": logp}, mb)[0].item() == pytest.approx(expected.item(), abs=1e-6)
    arithmetic = policy_loss(partial(gmpo, clip_low=0.4, clip_high=0.4), loss_agg_mode="seq-mean-token-mean",
                            rollout_correction=correction, weights_in_objective=False)
    assert abs(arithmetic({"logprobs": logp}, mb)[0].item() - expected.item()) > 1e-3
    assert PolicyTerm(gmpo).inside and not PolicyTerm(ppo_clip).inside
    with pytest.raises(ValueError, match="weights_in_objective"):
        PolicyTerm(ppo_clip, weights_in_objective=True)
