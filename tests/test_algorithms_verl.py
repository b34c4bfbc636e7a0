"""The prebuilt graphs after verl's estimators and losses, the adaptive KL controller and PF-PPO: their graphs,
a two-step run of each on the real engines, and the controller's coefficient across a checkpoint and resume."""

import json
import math

import pytest
from pydantic import ValidationError

from fakes import ROLE_CLASSES
from flowrl.algorithms import REGISTRY, ppo
from flowrl.config import load_run_config
from flowrl.graph.role import ROLES
from flowrl.runtime.trainer import train
from crash import train_until_crash

INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer"}
NEW = ["reinforce_pp_baseline", "gpg", "opo", "grpo_passk", "sapo", "gmpo", "clip_cov", "kl_cov", "pf_ppo", "otb"]


def names(graph):
    return set(graph.nodes)


def test_ppo_adaptive_kl_runs_the_controller_role():
    fixed, _ = ppo.trace(INPUTS, ROLE_CLASSES)
    assert "token_rewards" in names(fixed) and "kl_ctrl.token_rewards" not in names(fixed)
    classes = {**ROLE_CLASSES, "kl_ctrl": ROLES.get("kl_ctrl").cls}
    adaptive, _ = ppo.trace(INPUTS, classes, {"kl_ctrl": "adaptive", "target_kl": 0.05, "horizon": 100})
    node = adaptive.nodes["kl_ctrl.token_rewards"]["node"]
    assert node.kwargs == {"init_coef": 0.001, "target_kl": 0.05, "horizon": 100}
    assert adaptive.has_edge("ref.logprobs", "kl_ctrl.token_rewards") and "token_rewards" not in names(adaptive)
    with pytest.raises(ValidationError, match="kl_ctrl"):
        ppo.make_config({"kl_ctrl": "adaptive", "kl_coef": 0.0})


def test_pf_ppo_resamples_before_both_updates():
    graph, _ = REGISTRY["pf_ppo"].trace(INPUTS, ROLE_CLASSES)
    assert graph.has_edge("gae_advantage", "pf_ppo_resample")
    assert graph.has_edge("pf_ppo_resample", "critic.update") and graph.has_edge("pf_ppo_resample", "actor.update")


def test_otb_reads_the_actors_sum_pi_squared():
    graph, _ = REGISTRY["otb"].trace(INPUTS, ROLE_CLASSES)
    assert graph.nodes["actor.logprobs"]["node"].writes == {"old_logprobs", "sum_pi_squared"}
    assert graph.has_edge("actor.logprobs", "otb_advantage") and "ref.logprobs" not in names(graph)
    plain, _ = REGISTRY["grpo"].trace(INPUTS, ROLE_CLASSES)
    assert plain.nodes["actor.logprobs"]["node"].writes == {"old_logprobs"}


def config(tmp_path, *overrides):
    return load_run_config(None, [f"train.output_dir={tmp_path}", "train.batch_size=8", *overrides])


@pytest.mark.parametrize("algorithm", NEW)
def test_each_new_algorithm_trains_on_the_real_engines(tmp_path, algorithm):
    history = train(config(tmp_path, f"algorithm={algorithm}", "train.steps=2", "train.save_every=0"), progress=False)
    assert len(history) == 2
    assert math.isfinite(history[-1]["actor/pg_loss"]) and math.isfinite(history[-1]["actor/grad_norm"])


def test_adaptive_kl_coefficient_survives_a_resume(tmp_path):
    run = ["algorithm=ppo", "algo.kl_ctrl=adaptive", "algo.horizon=16", "train.steps=4", "train.save_every=2"]
    straight = train(config(tmp_path / "a", *run), progress=False)
    coefs = [row["kl_ctrl/coef"] for row in straight]
    assert coefs[0] == 0.001 and len(set(coefs)) == 4  # it moves every step (8 rows / horizon 16, clipped error)

    train_until_crash(config(tmp_path / "b", *run), 3)
    saved = json.loads((tmp_path / "b/checkpoints/step_000002/kl_ctrl/kl_ctrl.json").read_text())
    assert saved["coef"] == pytest.approx(coefs[2])  # the coefficient step 3 uses
    resumed = train(config(tmp_path / "b", *run), progress=False)
    for key in ("kl_ctrl/coef", "reward/kl", "actor/pg_loss", "critic/vf_loss"):
        assert [row[key] for row in resumed] == [row[key] for row in straight[2:]], key


def test_loss_presets_bind_verl_defaults_and_sum_token_sum_micro_batches():
    from flowrl.rl import losses
    from flowrl.rl.ops import cov_loss, policy_gradient

    assert losses.sapo_loss().objective.keywords == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert losses.sapo_loss().loss_agg_mode == losses.gmpo_loss().loss_agg_mode == "seq-mean-token-mean"
    assert losses.gmpo_loss().objective.func is policy_gradient.gmpo
    assert losses.clip_cov_loss().objective.keywords == {"clip_low": 0.2, "clip_high": 0.2, "cov_ratio": 2e-4,
                                                         "cov_lb": 1.0, "cov_ub": 5.0}
    assert losses.kl_cov_loss().objective.func is cov_loss.kl_cov
    assert losses.reinforce_loss().objective is policy_gradient.reinforce
    assert losses.ppo_loss(kl_coef=0.1, kl_kind="k3+").kl_kind == "k3+"
    assert losses.ppo_loss(loss_agg_mode="token-sum").combine == "sum"
    assert losses.ValueLoss(loss_agg_mode="token-sum").combine == "sum"
    assert losses.sapo_loss().combine == losses.ValueLoss().combine == "mean"
    with pytest.raises(ValueError, match="loss_agg_mode"):
        losses.ppo_loss(loss_agg_mode="token-total")
    assert REGISTRY["dppo"].make_config({}).ratio_cap == 3.0  # verl's clip_ratio_c default
