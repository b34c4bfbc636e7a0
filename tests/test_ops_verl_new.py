"""GDPO, the multi-turn optimal token baseline, DRO and bypass mode against tests/verl_reference.py's
transcriptions of verl's core_algos.py (v0.9.0 = 1dda039): a hand value each, then random inputs whose masks
have interior gaps (tool observations) and padding."""

import pytest
import torch
from tensordict import TensorDict

import verl_reference as verl
from flowrl.rl.bypass import bypass_loss
from flowrl.rl.correction import RolloutCorrection, RolloutCorrectionConfig
from flowrl.rl.loss_terms import policy_loss
from flowrl.rl.ops.advantages import optimal_token_baseline, tir_optimal_token_baseline
from flowrl.rl.ops.gdpo import gdpo
from flowrl.rl.ops.policy_gradient import dro
from flowrl.rl import stages


def t(*rows):
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.float32)


def gapped_mask(g, rows, width):
    mask = (torch.rand(rows, width, generator=g) > 0.3).float()
    mask[:, 0] = 1.0
    mask[0, width // 2:] = 0.0
    return mask


def test_gdpo_by_hand_normalises_each_component_apart():
    # one group of 3 rows, one token each; format [1, 1, 0] and accuracy [10, 0, 0]:
    # GRPO each: [.57735, .57735, -1.1547] and [1.1547, -.57735, -.57735] (the 10 does not dominate)
    # sum [1.7321, 0, -1.7321]: mean 0, unbiased var 3 -> whitened [1, 0, -1]
    scores = t([1.0, 10.0], [1.0, 0.0], [0.0, 0.0])
    adv = gdpo(scores, torch.tensor([0, 0, 0]), torch.ones(3, 1))
    assert torch.allclose(adv, t([1.0], [0.0], [-1.0]), atol=1e-5)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("weights, norm_by_std", [(None, True), ([0.3, 1.5], True), ([1.0, 2.0], False)])
def test_gdpo_equals_verls_on_random_inputs(seed, weights, norm_by_std):
    g = torch.Generator().manual_seed(seed)
    mask = gapped_mask(g, 8, 6)
    index = torch.tensor([0, 0, 0, 1, 1, 1, 2, 3])  # two groups of 3 and two of 1
    scores = torch.stack([torch.randint(0, 2, (8,), generator=g).float(), torch.rand(8, generator=g) * 5], -1)
    expected = verl.gdpo([scores[:, 0], scores[:, 1]], mask, index, weights, norm_by_std=norm_by_std)
    assert torch.allclose(gdpo(scores, index, mask, weights, norm_by_std=norm_by_std), expected, atol=1e-5)
    # one component (verl's fallback to the plain score) is whitened GRPO
    assert torch.allclose(gdpo(scores[:, 1], index, mask), verl.gdpo([scores[:, 1]], mask, index), atol=1e-5)


def test_tir_otb_by_hand_aligns_generated_tokens_across_a_tool_span():
    # one group; row 0 = token, tool observation (mask 0), token with reward 1; row 1 = two tokens, reward 0
    # pi = .5, sum pi^2 = .5 -> w = .5 per valid token; packed: G = [[1, 1], [0, 0]], W = [[.5, 1], [.5, 1]]
    # B_0 = (1 * .5 + 0) / 1 = .5, B_1 = (1 * 1 + 0) / 2 = .5 -> A = [[.5, -, .5], [-.5, -.5, -]]
    rewards, mask = t([0.0, 0.0, 1.0], [0.0, 0.0, 0.0]), t([1.0, 0.0, 1.0], [1.0, 1.0, 0.0])
    old, spi = torch.full((2, 3), 0.5).log(), torch.full((2, 3), 0.5)
    adv, _ = tir_optimal_token_baseline(rewards, mask, torch.tensor([0, 0]), old, spi)
    assert torch.allclose(adv, t([0.5, 0.0, 0.5], [-0.5, -0.5, 0.0]))
    # plain OTB meets row 0's second token with row 1's padding at t = 2: alone there, its baseline is its
    # own return (both rows are 2 tokens long, so no zero tail) and A = 0
    plain, _ = optimal_token_baseline(rewards, mask, torch.tensor([0, 0]), old, spi)
    assert plain[0, 2] == pytest.approx(0.0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("handle_zero_tail", [True, False])
def test_tir_otb_equals_verls_on_random_inputs(seed, handle_zero_tail):
    g = torch.Generator().manual_seed(seed)
    mask = gapped_mask(g, 7, 9)
    mask[5] = 0.0  # a row without valid tokens joins no group
    index = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    rewards = torch.where(torch.rand(7, 9, generator=g) > 0.7, torch.randn(7, 9, generator=g), 0.0)
    old = -torch.rand(7, 9, generator=g) * 3
    spi = torch.rand(7, 9, generator=g) * 0.5 + 0.1
    is_w = torch.rand(7, 9, generator=g) + 0.5 if seed % 2 else None
    expected, expected_returns = verl.tir_optimal_token_baseline(rewards, mask, index, old, spi, is_w,
                                                                 handle_zero_tail)
    garbage = torch.where(mask.bool(), rewards, float("nan"))
    adv, returns = tir_optimal_token_baseline(garbage, mask, index, old, spi, is_w, handle_zero_tail)
    assert torch.allclose(adv, expected, atol=1e-5)
    assert torch.allclose(returns, expected_returns * mask, atol=1e-5)


def test_dro_by_hand():
    logp, old, adv = t(-1.0, -2.0, -0.5), t(-1.0, -1.0, -1.0), t(1.0, -1.0, 2.0)
    loss, _ = dro(logp, old, adv, t(1, 1, 1), beta=0.5)
    # -(A logp - .25 (logp - old)^2): [1 - 0, -2 + .25, 1 + .0625]
    assert torch.allclose(loss, t(1.0, -1.75, 1.0625))
    with pytest.raises(ValueError, match="beta"):
        dro(logp, old, adv, t(1, 1, 1), beta=0.0)


def policy_batch(seed, rows=6, width=7):
    g = torch.Generator().manual_seed(seed)
    mask = gapped_mask(g, rows, width)
    rollout = -torch.rand(rows, width, generator=g) * 2
    logp = rollout + 0.4 * torch.randn(rows, width, generator=g)
    adv = torch.randn(rows, width, generator=g)
    mb = TensorDict({"old_logprobs": rollout.clone(), "rollout_logprobs": rollout, "advantages": adv,
                     "loss_mask": mask}, batch_size=[rows])
    return mb, logp


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_dro_equals_verls_on_random_inputs(seed, mode):
    mb, logp = policy_batch(seed)
    loss_fn = policy_loss(lambda *a: dro(*a, beta=0.3), loss_agg_mode=mode)
    expected = verl.dro(mb["old_logprobs"], logp, mb["advantages"], mb["loss_mask"], 0.3, mode)
    assert loss_fn({"logprobs": logp}, mb)[0].item() == pytest.approx(expected.item(), abs=1e-5)
    weights = verl.rollout_is_weights(mb["old_logprobs"] - mb["rollout_logprobs"] + 0.0, mb["loss_mask"])
    corrected = policy_loss(lambda *a: dro(*a, beta=0.3), loss_agg_mode=mode,
                            rollout_correction=RolloutCorrectionConfig(is_level="token").build())
    expected = verl.dro(mb["old_logprobs"], logp, mb["advantages"], mb["loss_mask"], 0.3, mode, weights)
    assert corrected({"logprobs": logp}, mb)[0].item() == pytest.approx(expected.item(), abs=1e-5)


def test_bypass_reinforce_by_hand():
    # rollout logp = log .5 on both tokens; current logp = log .8 and log .25: rho = 1.6 and .5
    # reinforce: -A * logp * rho = -1 * ln .8 * 1.6 = .357030 and -(-2) * ln .25 * .5 = -1.386294; mean -.514632
    rollout = torch.full((1, 2), 0.5).log()
    mb = TensorDict({"old_logprobs": rollout, "rollout_logprobs": rollout, "advantages": t([[1.0, -2.0]]),
                     "loss_mask": torch.ones(1, 2)}, batch_size=[1])
    loss, _ = bypass_loss("reinforce")({"logprobs": t([[0.8, 0.25]]).log()}, mb)
    assert loss.item() == pytest.approx(-0.514632, abs=1e-6)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
@pytest.mark.parametrize("mode, rs", [("token-mean", None), ("token-mean", ("token_k3", 0.05)),
                                      ("seq-mean-token-mean", ("token_k1", 1.4)),
                                      ("seq-mean-token-sum", ("seq_max_k2", 0.1))])
def test_bypass_mode_equals_verls_on_random_inputs(seed, loss_type, mode, rs):
    mb, logp = policy_batch(seed)
    level = {None: "off", "token_k3": "token", "token_k1": "token", "seq_max_k2": "max"}[rs and rs[0]]
    correction = RolloutCorrectionConfig(is_level="token", is_threshold=2.0, rs_level=level,
                                         rs_threshold=rs[1] if rs else 2.0,
                                         rs_estimator=rs[0][-2:] if rs else "k1").build()
    loss_fn = bypass_loss(loss_type, correction, loss_agg_mode=mode)
    logp = logp.clone().requires_grad_(True)
    loss, metrics = loss_fn({"logprobs": logp}, mb)
    expected = verl.bypass_mode(mb["rollout_logprobs"], logp, mb["advantages"], mb["loss_mask"], loss_type, mode,
                                *(rs or (None, None)))
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)
    loss.backward()
    logp_ref = logp.detach().clone().requires_grad_(True)
    verl.bypass_mode(mb["rollout_logprobs"], logp_ref, mb["advantages"], mb["loss_mask"], loss_type, mode,
                     *(rs or (None, None))).backward()
    assert torch.allclose(logp.grad, logp_ref.grad, atol=1e-6)


def test_bypass_stage_and_loss_options():
    batch = TensorDict({"rollout_logprobs": t([[-1.0, -2.0]])}, batch_size=[1])
    assert torch.equal(stages.rollout_as_old_logprobs(batch)["old_logprobs"], t([[-1.0, -2.0]]))
    assert bypass_loss("ppo_clip").rollout_correction == RolloutCorrection(RolloutCorrectionConfig(), bypass=True)
    with pytest.raises(ValueError, match="loss_type"):
        bypass_loss("vanilla")
