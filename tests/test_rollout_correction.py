"""Rollout correction as a policy-loss option: loss values, weights, presets, algorithm configs, a CPU run."""

import math
import warnings

import pytest
import torch
from tensordict import TensorDict

from fakes import ROLE_CLASSES
from flowrl.algorithms import REGISTRY, GRPOConfig
from flowrl.config import load_run_config, validate
from flowrl.graph.role import ROLES
from flowrl.rl.correction import RolloutCorrection, RolloutCorrectionConfig
from flowrl.rl.losses import (policy_loss, cispo_loss, clip_higher_loss, dppo_kl_loss, dppo_tv_loss, gspo_loss,
                              ppo_loss)
from flowrl.rl.ops.policy_loss import ppo_clip
from flowrl.runtime.trainer import train

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # 3 valid tokens in 2 rows


def batch(rho=((3.0, 0.6), (1.5,))):
    """logp = old = 0 (PPO ratio 1), A = 1 in row 0 and -4 in row 1; rollout = -ln rho, so old - rollout = ln rho."""
    rollout = torch.zeros(2, 3)
    for i, row in enumerate(rho):
        rollout[i, :len(row)] = -torch.tensor(row).log()
    rollout[~MASK.bool()] = float("nan")  # padding garbage
    return TensorDict({"old_logprobs": torch.zeros(2, 3), "advantages": torch.tensor([[1.0] * 3, [-4.0] * 3]),
                       "ref_logprobs": torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]),
                       "rollout_logprobs": rollout, "response_mask": MASK, "loss_mask": MASK}, batch_size=[2])


def outputs():
    return {"logprobs": torch.zeros(2, 3).requires_grad_(True), "entropy": torch.tensor([[1.0, 2.0, 9], [3, 9, 9]])}


def test_token_tis_weights_the_policy_loss_and_logs_the_mismatch():
    out = outputs()
    correction = RolloutCorrectionConfig(is_level="token", is_threshold=2.0).build()
    loss, metrics = ppo_loss(rollout_correction=correction)(out, batch())
    # rho [3, .6 | 1.5] -> weights min(rho, 2) = [2, .6 | 1.5]; -A = [-1, -1 | 4]
    # token-mean of -A * w: (-2 - .6 + 6) / 3 = 1.133333 (without correction (-1 - 1 + 4) / 3 = .666667)
    assert loss.item() == pytest.approx(3.4 / 3)
    # weight mean (2 + .6 + 1.5) / 3 = 1.366667; 1 of 3 ratios (3) above 2
    assert metrics["rollout/is_weight_mean"] == pytest.approx(4.1 / 3)
    assert metrics["rollout/is_truncated_fraction"] == pytest.approx(1 / 3)
    # k1 kl = mean(rollout - old) = -(ln 3 + ln .6 + ln 1.5) / 3 = -(1.098612 - .510826 + .405465) / 3 = -.331084
    assert metrics["rollout/kl"] == pytest.approx(-0.331084, abs=1e-6)
    assert metrics["rollout/max_abs_diff"] == pytest.approx(math.log(3.0))  # 1.098612
    assert metrics["rollout/masked_fraction"] == 0.0
    loss.backward()
    # d(-A w r)/dlogp / 3 at r = 1: -2/3, -.6/3 = -.2 | 6/3 = 2; padding 0
    assert torch.allclose(out["logprobs"].grad, torch.tensor([[-2 / 3, -0.2, 0.0], [2.0, 0.0, 0.0]]))


def test_token_rejection_drops_tokens_from_every_term_but_keeps_the_count():
    correction = RolloutCorrectionConfig(rs_level="token", rs_threshold=2.0).build()
    loss_fn = ppo_loss(rollout_correction=correction, kl_coef=0.1, kl_kind="k2", entropy_coef=0.01)
    out = outputs()
    loss, metrics = loss_fn(out, batch())
    # rho [3, .6 | 1.5] in [.5, 2]: token 0 (rho 3) rejected
    # pg: (0 - 1 + 4) / 3 = 1; k2 = .5 (logp - ref)^2 = [.5, .5 | .5] -> (0 + .5 + .5) / 3 = 1/3
    # entropy [1, 2 | 3] -> (0 + 2 + 3) / 3 = 5/3; loss = 1 + .1/3 - .01 * 5/3 = 1.016667
    assert metrics["pg_loss"] == pytest.approx(1.0) and metrics["kl_loss"] == pytest.approx(1 / 3)
    assert metrics["entropy"] == pytest.approx(5 / 3) and loss.item() == pytest.approx(1 + 0.1 / 3 - 0.05 / 3)
    assert metrics["rollout/masked_fraction"] == pytest.approx(1 / 3) and "rollout/is_weight_mean" not in metrics
    assert loss_fn.weight(batch()) == 3.0  # the rejected token still counts
    loss.backward()
    assert out["logprobs"].grad[0, 0] == 0.0  # no gradient from any term on the rejected token


def test_sequence_rejection_drops_whole_rows():
    correction = RolloutCorrectionConfig(rs_level="sequence", rs_threshold=1.7).build()
    loss, metrics = ppo_loss(rollout_correction=correction)(outputs(), batch())
    # row ratios 3 * .6 = 1.8 > 1.7: row 0 rejected; 1.5 in [1/1.7 = .588, 1.7] kept -> (0 + 0 + 4) / 3
    assert loss.item() == pytest.approx(4 / 3)
    assert metrics["rollout/masked_fraction"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("correction", [
    RolloutCorrectionConfig(is_level="sequence", is_threshold=1.6).build(),
    RolloutCorrectionConfig(is_level="token", is_threshold=2.5, rs_level="token", rs_threshold=2.0).build()])
def test_weighted_micro_batches_still_give_the_mini_batch_loss(mode, correction):
    loss_fn = clip_higher_loss(loss_agg_mode=mode, kl_coef=0.1, rollout_correction=correction)
    mb = batch()
    mb["old_logprobs"] = torch.tensor([[0.1, -0.2, 0.0], [0.3, 0.0, 0.0]])  # PPO ratios != 1 too
    full, _ = loss_fn(outputs(), mb)
    parts = [(loss_fn({"logprobs": torch.zeros(1, 3)}, mb[i:i + 1])[0], loss_fn.weight(mb[i:i + 1])) for i in (0, 1)]
    combined = sum(loss * w for loss, w in parts) / sum(w for _, w in parts)
    assert combined.item() == pytest.approx(full.item())
    assert full.item() != pytest.approx(clip_higher_loss(loss_agg_mode=mode, kl_coef=0.1)(outputs(), mb)[0].item())


@pytest.mark.parametrize("make", [clip_higher_loss, ppo_loss, gspo_loss, cispo_loss, dppo_tv_loss, dppo_kl_loss])
def test_every_preset_takes_the_option_and_is_unchanged_without_it(make):
    assert "rollout_logprobs" not in make().reads
    corrected = make(rollout_correction=RolloutCorrectionConfig(log_mismatch=True).build())  # metrics only: same loss
    assert corrected.reads[-1] == "rollout_logprobs"
    (plain, plain_metrics), (loss, metrics) = make()(outputs(), batch()), corrected(outputs(), batch())
    assert loss.item() == plain.item() and "rollout/kl" in metrics and "rollout/kl" not in plain_metrics


@pytest.mark.parametrize("make, name", [
    (lambda: RolloutCorrectionConfig(is_level="seq"), "is_level"),
    (lambda: RolloutCorrectionConfig(rs_level="tokens"), "rs_level"),
    (lambda: RolloutCorrectionConfig(is_level="token", is_threshold=0.0), "is_threshold"),
    (lambda: RolloutCorrectionConfig(rs_level="token", rs_threshold=-1.0), "rs_threshold"),
    (lambda: RolloutCorrectionConfig(rs_level="token", rs_threshold=2.0, rs_threshold_lower=3.0), "rs_threshold_lower"),
    (lambda: RolloutCorrectionConfig(rs_level="max"), "rs_estimator"),  # k1 at max: verl has no seq_max_k1
    (lambda: RolloutCorrectionConfig(rs_level="token", rs_estimator="k3", rs_threshold_lower=0.1),
     "rs_threshold_lower"),  # k2 / k3 bound the divergence above only
    (lambda: policy_loss(ppo_clip, rollout_correction="token"), "rollout_correction"),
    (lambda: validate(GRPOConfig, {"rollout_correction": {"is_threshold": 0}}, "algo"),
     "algo.rollout_correction.is_threshold"),
    (lambda: validate(GRPOConfig, {"rollout_correction": {"is_level": "tok"}}, "algo"),
     "algo.rollout_correction.is_level"),
    (lambda: RolloutCorrectionConfig(rs_level="token", rs_threshold=0.5), "rs_threshold_lower"),
])
def test_bad_settings_raise_naming_them(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_settings_without_effect_warn():
    with pytest.warns(UserWarning, match="is_threshold"):
        RolloutCorrectionConfig(is_threshold=3.0, log_mismatch=True)
    with pytest.warns(UserWarning, match="rs_threshold"):
        RolloutCorrectionConfig(rs_threshold_lower=0.2, is_level="token")
    with pytest.warns(UserWarning, match="algo.rollout_correction.rs_threshold"):
        RolloutCorrectionConfig(is_level="token", rs_threshold=3.0)
    with pytest.warns(UserWarning, match="log_mismatch"):
        RolloutCorrectionConfig(is_level="token", log_mismatch=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RolloutCorrectionConfig(is_level="sequence", is_threshold=3.0, rs_level="geometric", rs_threshold=1.5)


def test_config_builds_the_loss_option():
    assert RolloutCorrectionConfig().build() is None  # off: the loss is unchanged
    metrics_only = RolloutCorrectionConfig(log_mismatch=True).build()  # both off: the metrics only
    assert (metrics_only.is_level, metrics_only.rs_level) == (None, None)
    built = RolloutCorrectionConfig(is_level="sequence", is_threshold=3.0, rs_level="token", rs_threshold_lower=0.1)
    assert built.build() == RolloutCorrection(built) and built.build().config is built  # the config itself
    assert (built.build().is_level, built.build().rs_level) == ("sequence", "token")
    algo = load_run_config(None, ["algo.rollout_correction.is_level=token", "algo.rollout_correction.is_threshold=4"])
    built = validate(GRPOConfig, algo.algo).rollout_correction.build()
    assert built == RolloutCorrectionConfig(is_level="token", is_threshold=4.0).build()


OFF_POLICY = {"grpo_async"}
# every algorithm that samples has a policy loss and the option; sft and rm sample nothing
SAMPLING = sorted(name for name in REGISTRY if "rollout" in REGISTRY[name].roles)


def test_only_the_algorithms_that_sample_nothing_lack_the_option():
    lacking = {name for name in REGISTRY if "rollout_correction" not in REGISTRY[name].config_cls.model_fields}
    assert lacking == set(REGISTRY) - set(SAMPLING) == {"sft", "rm"}


@pytest.mark.parametrize("name", SAMPLING)
def test_every_algorithm_passes_the_option_to_its_policy_loss(name):
    inputs = {"prompt_ids", "prompt_mask", "uid", "answer"}
    option = {"rollout_correction": {"is_level": "token", "rs_level": "geometric", "rs_threshold": 1.5}}
    classes = {**ROLE_CLASSES, "teacher": ROLES.get("teacher").cls}
    graph, _ = REGISTRY[name].trace(inputs, classes, option)
    update = graph.nodes["actor.update"]["node"]
    expected = RolloutCorrectionConfig(is_level="token", is_threshold=2.0, rs_level="geometric", rs_threshold=1.5)
    assert update.kwargs["loss"].rollout_correction == expected.build()
    assert "rollout_logprobs" in update.reads  # written by rollout.generate, or tracing would fail
    default, _ = REGISTRY[name].trace(inputs, classes)
    # off by default, but for the off-policy graph, whose behaviour policy is the lagging sampler's
    expected = RolloutCorrectionConfig(is_level="token", is_threshold=2.0).build() if name in OFF_POLICY else None
    assert default.nodes["actor.update"]["node"].kwargs["loss"].rollout_correction == expected


@pytest.mark.parametrize("mini_batch", [128, 32])  # 128: one step, old logprobs deferred; 32: computed first
def test_grpo_with_token_tis_runs_on_cpu_and_logs_a_tiny_mismatch(tmp_path, mini_batch):
    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "train.steps=2", "train.batch_size=8",
                                 f"roles.actor.mini_batch_size={mini_batch}", "roles.actor.micro_batch_size=16",
                                 "checkpoint.every=0", "checkpoint.export=false", "algo.rollout_correction.is_level=token"])
    history = train(cfg, progress=False)
    assert len(history) == 2
    for row in history:  # HF sampler and trainer in fp32 on CPU agree to ~1e-6
        assert 0 <= row["actor/rollout/max_abs_diff"] < 1e-4
        assert row["actor/rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
        assert abs(row["actor/rollout/kl"]) < 1e-5 and abs(row["actor/rollout/k3_kl"]) < 1e-6
        assert row["actor/rollout/masked_fraction"] == 0.0 and math.isfinite(row["actor/pg_loss"])
