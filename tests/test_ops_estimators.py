"""The advantage estimators after REINFORCE++ (RF++-baseline, GPG, OPO, GRPO pass@k, OTB) on tiny tensors,
and against step-by-step restatements of verl's on random inputs (tests/verl_reference.py)."""

import pytest
import torch

import verl_reference as verl
from flowrl.rl.ops.advantages import (gpg, grpo_passk, opo, optimal_token_baseline, reinforce_pp,
                                      reinforce_pp_baseline)

NAN = float("nan")


def t(*rows):
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.float32)


ONE_TOKEN = torch.ones(3, 1)


def test_reinforce_pp_baseline_hand_values():
    # groups {0: [1, 0]}, {1: [2]}: centred [.5, -.5, 2] (a single row keeps its score);
    # whitened over 3 tokens: mean 2/3, unbiased var ((-1/6)^2 + (-7/6)^2 + (4/3)^2) / 2 = 1.5833
    adv = reinforce_pp_baseline(t(1, 0, 2), torch.tensor([0, 0, 1]), ONE_TOKEN)
    assert torch.allclose(adv.flatten(), t(-0.13245, -0.92715, 1.05960), atol=1e-4)


def test_gpg_scales_by_the_share_of_nonzero_scores():
    # 4 rows, 1 nonzero: alpha 4; group 0 [1, 0] - .5 -> [.5, -.5] * 4; group 1 [0, 0] -> 0
    adv = gpg(t(1, 0, 0, 0), torch.tensor([0, 0, 1, 1]), torch.ones(4, 1))
    assert torch.equal(adv.flatten(), t(2, -2, 0, 0))
    # f_norm divides; a group of one keeps its score (times alpha 3/2 here: 2 of 3 rows nonzero)
    adv = gpg(t(1, 0, 3), torch.tensor([0, 0, 1]), ONE_TOKEN, f_norm=2.0)
    assert torch.allclose(adv.flatten(), t(0.375, -0.375, 2.25))


def test_opo_length_weighted_baseline():
    # one group, lengths [1, 3]: baseline (1 * 1 + 3 * 0) / 4 = .25 -> [.75, -.25] on valid tokens
    adv = opo(t(1, 0), torch.tensor([0, 0]), t([1, 0, 0], [1, 1, 1]))
    assert torch.equal(adv, t([0.75, 0, 0], [-0.25, -0.25, -0.25]))
    # a group of one: baseline 0
    assert torch.equal(opo(torch.tensor([2.0]), torch.tensor([5]), t([[1, 1]])), t([[2, 2]]))


def test_grpo_passk_only_the_best_row_learns():
    # [1, 0, .5]: best 1, second .5 -> .5 on row 0; with std (unbiased .5): .5 / (.5 + 1e-6)
    groups = torch.tensor([0, 0, 0])
    assert torch.equal(grpo_passk(t(1, 0, 0.5), groups, ONE_TOKEN, norm_by_std=False).flatten(), t(0.5, 0, 0))
    assert torch.allclose(grpo_passk(t(1, 0, 0.5), groups, ONE_TOKEN).flatten(), t(1, 0, 0), atol=1e-5)
    with pytest.raises(ValueError, match="2 samples per group"):
        grpo_passk(t(1, 0, 0.5), torch.tensor([0, 0, 1]), ONE_TOKEN)


def test_optimal_token_baseline_hand_values():
    # one group of 2 rows, 2 tokens, reward 1 / 0 on the last token: G = [[1, 1], [0, 0]]
    # pi = exp(old) = .5 everywhere, sum pi^2 = .5: w = 1 - 1 + .5 = .5, W = [.5, 1] in both rows
    # B_t = (1 * W + 0 * W) / (2 W) = .5 -> A = [[.5, .5], [-.5, -.5]]
    old, spp = torch.full((2, 2), 0.5).log(), torch.full((2, 2), 0.5)
    adv, ret = optimal_token_baseline(t([0, 1], [0, 0]), torch.ones(2, 2), torch.tensor([0, 0]), old, spp)
    assert torch.equal(ret, t([1, 1], [0, 0]))
    assert torch.allclose(adv, t([0.5, 0.5], [-0.5, -0.5]))
    # zero tail: row 0 three tokens, row 1 one; past t=1 only row 0 is valid, its baseline is 0 there
    mask = t([1, 1, 1], [1, 0, 0])
    adv, _ = optimal_token_baseline(t([0, 0, 1], [1, NAN, NAN]), mask, torch.tensor([0, 0]),
                                    torch.full((2, 3), 0.5).log(), torch.full((2, 3), 0.5))
    # t0: G = [1, 1], B = 1 -> 0, 0; t1, t2: row 0 alone, B zeroed -> A = G = 1
    assert torch.allclose(adv, t([0, 1, 1], [0, 0, 0]))


def _random_batch(seed, rows=12, width=7, groups=4):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width) < lengths.unsqueeze(-1)).float()
    scores = torch.randint(0, 3, (rows,), generator=g).float() - 0.5 * torch.rand(rows, generator=g).round()
    index = torch.randint(0, groups, (rows,), generator=g)
    index[:groups] = torch.arange(groups)  # every group has a row; some have one
    return scores, mask, index, g


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_outcome_estimators_match_verl(seed):
    scores, mask, index, _ = _random_batch(seed)
    assert torch.allclose(reinforce_pp_baseline(scores, index, mask), verl.reinforce_pp_baseline(scores, mask, index),
                          atol=1e-5)
    assert torch.allclose(gpg(scores, index, mask), verl.gpg(scores, mask, index), atol=1e-6)
    assert torch.allclose(opo(scores, index, mask), verl.opo(scores, mask, index), atol=1e-6)
    paired = torch.arange(12) // 3  # pass@k needs >= 2 rows per group
    for norm in (True, False):
        assert torch.allclose(grpo_passk(scores, paired, mask, norm_by_std=norm),
                              verl.grpo_passk(scores, mask, paired, norm_by_std=norm), atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reinforce_pp_and_otb_match_verl_with_interior_gaps(seed):
    scores, mask, index, g = _random_batch(seed)
    gaps = mask * (torch.rand(mask.shape, generator=g) > 0.3).float()  # observation spans inside responses
    gaps[:, 0] = mask[:, 0]
    rewards = torch.randn(mask.shape, generator=g)
    adv, ret = reinforce_pp(rewards, gaps, gamma=0.9)
    ref_adv, ref_ret = verl.reinforce_pp(rewards, gaps, 0.9)
    assert torch.allclose(ret, ref_ret, atol=1e-5) and torch.allclose(adv, ref_adv, atol=1e-5)
    old = -torch.rand(mask.shape, generator=g) * 3
    spp = torch.rand(mask.shape, generator=g) * 0.5 + 0.1
    is_w = torch.rand(mask.shape, generator=g) + 0.5
    for weights in (None, is_w):
        for zero_tail in (True, False):
            adv, _ = optimal_token_baseline(rewards, mask, index, old, spp, weights, handle_zero_tail=zero_tail)
            expected = verl.optimal_token_baseline(rewards, mask, index, old, spp, weights, zero_tail)
            assert torch.allclose(adv, expected, atol=1e-5)
