"""policy_loss / value_loss Losses and their presets on a 2-row micro-batch."""

import math
import warnings

import pytest
import torch
from tensordict import TensorDict

from flowrl.rl.losses import (policy_loss, value_loss, cispo_loss, clip_higher_loss, dppo_kl_loss, dppo_tv_loss,
                           gspo_loss, ppo_loss)
from flowrl.rl.ops.policy_loss import dppo_kl, dppo_tv, ppo_clip

NAN = float("nan")


def t(*rows):
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.float32)


MASK = t([1, 1, 0], [1, 0, 0])  # 3 valid tokens in 2 rows


def policy_batch(pad=0.0):
    """logp = old = 0 (ratio 1); padding entries set to `pad`."""
    mb = TensorDict({
        "old_logprobs": torch.zeros(2, 3),
        "advantages": t([1, 1, 1], [-4, -4, -4]),
        "ref_logprobs": t([0, 1, 0], [-1, 0, 0]),
        "response_mask": MASK, "loss_mask": MASK,
    }, batch_size=[2])
    for key in ("old_logprobs", "advantages", "ref_logprobs"):
        mb[key][~MASK.bool()] = pad
    return mb


def outputs(pad=0.0):
    logprobs = torch.zeros(2, 3)
    entropy = t([1, 2, 9], [3, 9, 9])
    logprobs[~MASK.bool()], entropy[~MASK.bool()] = pad, pad
    return {"logprobs": logprobs.requires_grad_(True), "entropy": entropy}


def test_policy_loss_combines_terms():
    loss_fn = ppo_loss(kl_coef=0.1, kl_kind="k2", entropy_coef=0.01)
    loss, metrics = loss_fn(outputs(), policy_batch())
    # ratio 1 -> pg = -A on valid tokens [-1, -1, 4]: token-mean 2/3
    # k2 = .5 (logp - ref)^2 = [0, .5, .5]: mean 1/3; entropy [1, 2, 3]: mean 2
    # loss = 2/3 + .1 * 1/3 - .01 * 2 = .68
    assert loss.item() == pytest.approx(0.68)
    assert metrics["pg_loss"] == pytest.approx(2 / 3)
    assert metrics["kl_loss"] == pytest.approx(1 / 3)
    assert metrics["entropy"] == pytest.approx(2.0)
    assert metrics["clipfrac"] == 0.0 and metrics["ratio_mean"] == pytest.approx(1.0)
    # detached 0-d tensors: the engine reads them after the update, not once per micro-batch
    assert all(isinstance(v, torch.Tensor) and v.ndim == 0 and not v.requires_grad for v in metrics.values())


def test_policy_loss_padding_garbage_changes_neither_loss_nor_gradient():
    loss_fn = ppo_loss(kl_coef=0.1, kl_kind="k3", entropy_coef=0.01)
    clean_out, bad_out = outputs(), outputs(pad=NAN)
    clean, _ = loss_fn(clean_out, policy_batch())
    bad, _ = loss_fn(bad_out, policy_batch(pad=NAN))
    assert clean.item() == pytest.approx(bad.item())
    clean.backward()
    bad.backward()
    assert torch.equal(clean_out["logprobs"].grad, bad_out["logprobs"].grad)
    assert (bad_out["logprobs"].grad[~MASK.bool()] == 0).all()


def test_reads_entropy_and_weight():
    assert ppo_loss().reads == ("old_logprobs", "advantages", "loss_mask")
    assert ppo_loss(kl_coef=0.1).reads[-1] == "ref_logprobs"
    assert "entropy" not in ppo_loss().needs and "entropy" in ppo_loss(entropy_coef=1e-3).needs
    # without kl/entropy the loss reads neither ref_logprobs nor entropy
    _, metrics = ppo_loss()({"logprobs": torch.zeros(2, 3)}, policy_batch().exclude("ref_logprobs"))
    assert "kl_loss" not in metrics and "entropy" not in metrics
    mb = policy_batch()
    assert ppo_loss().weight(mb) == 3.0  # valid tokens
    assert ppo_loss(loss_agg_mode="seq-mean-token-mean").weight(mb) == 2.0  # rows


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_weighted_micro_batches_give_the_mini_batch_loss(mode):
    loss_fn = clip_higher_loss(loss_agg_mode=mode, kl_coef=0.1)
    mb = policy_batch()
    mb["old_logprobs"] = t([0.1, -0.2, 0], [0.3, 0, 0])  # ratios != 1
    full, _ = loss_fn(outputs(), mb)
    parts = [(loss_fn({"logprobs": torch.zeros(1, 3)}, mb[i:i + 1]), loss_fn.weight(mb[i:i + 1])) for i in (0, 1)]
    combined = sum(loss * w for (loss, _), w in parts) / sum(w for _, w in parts)
    assert combined.item() == pytest.approx(full.item())


def test_grpo_is_symmetric_clip_higher():
    grpo, ppo = clip_higher_loss(clip_low=0.2, clip_high=0.2), ppo_loss(clip=0.2)
    # same objective with the same clips, same settings
    grpo_objective, ppo_objective = grpo.term("pg_loss").objective, ppo.term("pg_loss").objective
    assert grpo_objective.func is ppo_objective.func and grpo_objective.keywords == ppo_objective.keywords
    assert (grpo.loss_agg_mode, grpo.terms[1:]) == (ppo.loss_agg_mode, ppo.terms[1:]) == ("token-mean", ())
    out = {"logprobs": t([[math.log(1.5)]])}
    mb = TensorDict({"old_logprobs": torch.zeros(1, 1), "advantages": torch.ones(1, 1),
                     "response_mask": torch.ones(1, 1), "loss_mask": torch.ones(1, 1)}, batch_size=[1])
    # A = 1, r = 1.5: GRPO/PPO clip at 1.2 -> -1.2; DAPO's default clip_high .28 -> -1.28
    assert grpo(out, mb)[0].item() == pytest.approx(-1.2)
    assert clip_higher_loss()(out, mb)[0].item() == pytest.approx(-1.28)


def test_presets():
    assert gspo_loss().loss_agg_mode == "seq-mean-token-mean"
    assert gspo_loss().term("pg_loss").objective.keywords == {"clip_low": 3e-4, "clip_high": 4e-4}
    assert cispo_loss().term("pg_loss").objective.keywords == {"clip_low": 10.0, "clip_high": 0.2}
    assert ppo_loss(clip=0.1).term("pg_loss").objective.func is ppo_clip
    assert ppo_loss(dual_clip=None).term("pg_loss").objective.keywords["dual_clip"] is None
    loss, _ = cispo_loss()(outputs(), policy_batch())
    # cispo at r = 1, logp = 0: -1 * A * 0 = 0
    assert loss.item() == 0.0


def test_dppo_presets():
    assert dppo_tv_loss().term("pg_loss").objective.func is dppo_tv
    assert dppo_kl_loss().term("pg_loss").objective.func is dppo_kl
    assert dppo_tv_loss().term("pg_loss").objective.keywords == {"clip_low": 0.15, "clip_high": 0.15, "ratio_cap": 20.0}
    loss_fn = dppo_kl_loss(clip_low=0.05, clip_high=0.05, ratio_cap=10.0, kl_coef=0.1)
    assert loss_fn.term("pg_loss").objective.keywords == {"clip_low": 0.05, "clip_high": 0.05, "ratio_cap": 10.0}
    assert loss_fn.reads[-1] == "ref_logprobs"
    out = outputs()
    loss, metrics = dppo_tv_loss()(out, policy_batch())
    # r = 1, p = q: nothing masked; -A * 1 * logp = 0 at logp = 0, gradient -A / 3 (token-mean)
    assert loss.item() == 0.0 and metrics["clipfrac"] == 0.0 and metrics["truncfrac"] == 0.0
    loss.backward()
    assert torch.allclose(out["logprobs"].grad, t([-1 / 3, -1 / 3, 0], [4 / 3, 0, 0]))


@pytest.mark.parametrize("make, name", [
    (lambda: policy_loss(ppo_clip, loss_agg_mode="sum"), "loss_agg_mode"),
    (lambda: policy_loss(ppo_clip, kl_kind="k9"), "kl_kind"),
    (lambda: policy_loss(ppo_clip, kl_coef=-1.0), "kl_coef"),
    (lambda: policy_loss("ppo"), "objective"),
    (lambda: policy_loss(ppo_clip, loss_agg_mode="seq-mean-token-sum-norm", norm_len=0), "norm_len"),
    (lambda: ppo_loss(dual_clip=0.5), "dual_clip"),
    (lambda: gspo_loss(clip_low=-1.0), "clip_low"),
    (lambda: dppo_tv_loss(clip_high=-1.0), "clip_high"),
    (lambda: dppo_kl_loss(ratio_cap=0.5), "ratio_cap"),
    (lambda: value_loss(clip=0.0), "clip"),
    (lambda: value_loss(loss_agg_mode="sum"), "loss_agg_mode"),
])
def test_bad_settings_raise(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_settings_without_effect_warn():
    with pytest.warns(UserWarning, match="norm_len"):
        policy_loss(ppo_clip, norm_len=512)
    with pytest.warns(UserWarning, match="kl_kind"):
        policy_loss(ppo_clip, kl_kind="k1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policy_loss(ppo_clip, loss_agg_mode="seq-mean-token-sum-norm", norm_len=512, kl_coef=0.1, kl_kind="k1")


def test_value_loss():
    loss_fn = value_loss(clip=0.5)
    assert loss_fn.reads == ("values", "returns", "loss_mask") and not "entropy" in loss_fn.needs
    mb = TensorDict({"values": t([0.0, 0.0, 1.0], [NAN, NAN, NAN]),  # old values from the rollout
                     "returns": t([2.0, 1.0, 1.0], [NAN, NAN, NAN]),
                     "response_mask": t([1, 1, 1], [0, 0, 0]), "loss_mask": t([1, 1, 1], [0, 0, 0])}, batch_size=[2])
    values = t([1.0, 0.0, 2.0], [5.0, 5.0, 5.0]).requires_grad_(True)
    loss, metrics = loss_fn({"values": values}, mb)
    # per token [1.125 (clipped), .5, .5] (see test_clipped_value_loss): mean .708333
    assert loss.item() == pytest.approx(2.125 / 3)
    assert metrics == pytest.approx({"vf_loss": 2.125 / 3, "vf_clipfrac": 1 / 3})
    assert loss_fn.weight(mb) == 3.0
    assert value_loss(loss_agg_mode="seq-mean-token-sum").weight(mb) == 1.0
    loss.backward()
    # d/dv .5 (v - R)^2 / 3 on unclipped tokens: (0 - 1)/3, (2 - 1)/3; clipped tok0 -> 0
    assert torch.allclose(values.grad, t([0.0, -1 / 3, 1 / 3], [0.0, 0.0, 0.0]))
