"""Advantage estimators against hand-derived values."""

import pytest
import torch

from flowrl.rl.ops.advantages import gae, grpo, group_std, reinforce_pp, remax, rloo
from flowrl.rl.ops.masked import masked_whiten

NAN = float("nan")


def t(*rows):
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.float32)


# 5 rows, 3 groups: {0: [1, 0]}, {1: [1, 1]}, {2: [5]}
SCORES = t(1, 0, 1, 1, 5)
GROUPS = torch.tensor([0, 0, 1, 1, 2])
MASK = t([1, 1], [1, 0], [1, 1], [0, 1], [1, 1])


def test_grpo_hand_values():
    # group 0: scores [1, 0], mean .5, std (unbiased) .7071 -> adv [.7071, -.7071]
    # group 1: scores [1, 1], mean 1, std 0 -> adv 0 / (0 + eps) = 0
    # group 2: one sample -> mean 0, std 1 -> adv 5 / (1 + 1e-6)
    adv_B = t(0.70711, -0.70711, 0, 0, 5 / (1 + 1e-6))
    assert torch.allclose(grpo(SCORES, GROUPS, MASK), adv_B.unsqueeze(-1) * MASK, atol=1e-5)


def test_dr_grpo_is_mean_centred_only():
    # group 0: [1, 0] - .5 -> [.5, -.5]; group 1: 0; group 2 (single): 5 - 0
    adv_B = t(0.5, -0.5, 0, 0, 5)
    assert torch.allclose(grpo(SCORES, GROUPS, MASK, norm_by_std=False), adv_B.unsqueeze(-1) * MASK)


def test_grpo_ignores_group_id_values_and_order():
    # same groups under other ids and interleaved rows -> same advantages per row
    groups = torch.tensor([7, 7, -3, -3, 100])
    assert torch.allclose(grpo(SCORES, groups, MASK), grpo(SCORES, GROUPS, MASK))
    perm = torch.tensor([2, 0, 4, 3, 1])
    assert torch.allclose(grpo(SCORES[perm], GROUPS[perm], MASK[perm]), grpo(SCORES, GROUPS, MASK)[perm])


def test_group_std():
    # groups [1, 0] -> std .7071 (unbiased), [1, 1] -> 0, a single sample -> 1
    assert torch.allclose(group_std(SCORES, GROUPS), t(0.70711, 0.70711, 0, 0, 1), atol=1e-5)


def test_rloo_leave_one_out_and_singletons():
    scores, groups = t(1, 0, 2, 4), torch.tensor([0, 0, 0, 9])
    # group 0: mean 1, n 3: (s - 1) * 3/2 -> [0, -1.5, 1.5]
    # check: 0 - mean(1, 2) = -1.5 and 2 - mean(1, 0) = 1.5
    # group 9 has one sample: advantage = its score 4, as in verl
    mask = t([1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1])
    adv_B = t(0, -1.5, 1.5, 4)
    assert torch.allclose(rloo(scores, groups, mask), adv_B.unsqueeze(-1) * mask)


def test_outcome_estimators_reject_bad_shapes():
    with pytest.raises(ValueError, match="scores_B"):
        grpo(t(1, 0), GROUPS[:2], MASK)
    with pytest.raises(ValueError, match="group_B"):
        rloo(SCORES, GROUPS[:3], MASK)
    with pytest.raises(ValueError, match="group_B"):
        group_std(SCORES, GROUPS[:3])
    with pytest.raises(ValueError, match="baseline_B"):
        remax(SCORES, t(1, 2), MASK)


def test_gae_returns_and_whitened_advantages():
    rewards = t([0, 0, 1], [0, 1, 0])
    values = t([0.5, 0.5, 0.5], [0.5, 0.5, 0.0])
    mask = t([1, 1, 1], [1, 1, 0])
    # gamma 1, lam .5. row 0, backwards: t2 delta = 1 - .5 = .5 -> A .5;
    #   t1 delta = 0 + .5 - .5 = 0 -> A = 0 + .5 * .5 = .25; t0 -> A = .125
    # row 1 (t2 padding): t1 delta = 1 + 0 - .5 = .5 -> A .5; t0 delta = 0 + .5 - .5 = 0 -> A .25
    raw = t([0.125, 0.25, 0.5], [0.25, 0.5, 0.0])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    # returns = raw + values: [.625, .75, 1], [.75, 1, 0 (padding)]
    assert torch.allclose(ret, t([0.625, 0.75, 1.0], [0.75, 1.0, 0.0]))
    assert torch.allclose(adv, masked_whiten(raw, mask))
    # whitening over the 5 valid raw values: mean 1.625/5 = .325
    assert adv[mask.bool()].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert adv[1, 2].item() == 0.0


def test_gae_skips_interior_padding_and_ignores_garbage():
    # mask [1, 0, 1], gamma = lam = 1: t2 delta .5 -> A .5; t1 skipped;
    # t0 delta = 0 + v(t2) .5 - .5 = 0 -> A = .5; returns [1, 0, 1]
    mask = t([[1, 0, 1]])
    _, ret = gae(t([[0, NAN, 1]]), t([[0.5, 1e9, 0.5]]), mask)
    assert torch.allclose(ret, t([[1.0, 0.0, 1.0]]))
    rewards, values = t([0, 0, 1], [0, 1, 0]), t([0.5, 0.5, 0.5], [0.5, 0.5, 0.0])
    mask = t([1, 1, 1], [1, 1, 0])
    garbage_r, garbage_v = rewards.clone(), values.clone()
    garbage_r[1, 2], garbage_v[1, 2] = NAN, 1e6
    for a, b in zip(gae(rewards, values, mask, 1.0, 0.5), gae(garbage_r, garbage_v, mask, 1.0, 0.5)):
        assert torch.allclose(a, b)


def test_reinforce_pp_discounted_returns_carry_across_interior_gaps():
    rewards = t([0, 0, 1], [0, 2, NAN], [1, 5, 1])
    mask = t([1, 1, 1], [1, 1, 0], [1, 0, 1])
    # gamma .5. row 0: [.25, .5, 1]; row 1: [2 * .5, 2, 0 (trailing padding)]
    # row 2: t2 1; t1 is a gap (a tool observation): return 0, its reward 5
    # dropped, the running 1 carried undiscounted; t0 1 + .5 * 1 = 1.5
    adv, ret = reinforce_pp(rewards, mask, gamma=0.5)
    assert torch.allclose(ret, t([0.25, 0.5, 1], [1, 2, 0], [1.5, 0, 1]))
    assert torch.allclose(adv, masked_whiten(ret, mask))
    assert adv[1, 2].item() == 0.0 and adv[2, 1].item() == 0.0


def test_reinforce_pp_multi_turn_equals_the_compact_trajectory():
    # verl issue 7278: [act, act, obs, obs, act, act], reward 1 at the end; without the
    # observations the return is 1 on every action token, and so it is with them
    expanded, mask = t([[0, 0, 0, 0, 0, 1]]), t([[1, 1, 0, 0, 1, 1]])
    _, ret = reinforce_pp(expanded, mask)
    assert torch.equal(ret, t([[1, 1, 0, 0, 1, 1]]))
    _, compact = reinforce_pp(t([[0, 0, 0, 1]]), torch.ones(1, 4))
    assert torch.equal(ret[mask.bool()], compact.flatten())


def test_remax():
    mask = t([1, 1, 0], [1, 1, 1])
    # returns: score on every valid token; advantages: score - baseline there
    # row 0: 1 - .5 = .5; row 1: 0 - .5 = -.5
    adv, ret = remax(t(1, 0), t(0.5, 0.5), mask)
    assert torch.allclose(ret, t([1, 1, 0], [0, 0, 0]))
    assert torch.allclose(adv, t([0.5, 0.5, 0], [-0.5, -0.5, -0.5]))
