"""The prebuilt graphs after verl's estimators and losses, the adaptive KL controller and PF-PPO: their graphs,
a two-step run of each on the real engines, the controller's coefficient across a checkpoint and resume, and
OTB's default zero tail against verl's."""

import inspect
import json
import math

import pytest
import torch
from pydantic import ValidationError
from tensordict import TensorDict

import verl_reference as verl
from fakes import ROLE_CLASSES
from flowrl.algorithms import REGISTRY, ppo
from flowrl.config import load_run_config
from flowrl.graph.role import ROLES
from flowrl.rl import stages
from flowrl.rl.ops.advantages import optimal_token_baseline
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


def otb_batch(token_rewards, mask, group, old_logprobs, sum_pi_squared):
    return TensorDict({"token_rewards": token_rewards, "response_mask": mask, "group": group,
                       "old_logprobs": old_logprobs, "sum_pi_squared": sum_pi_squared}, batch_size=[len(group)])


def otb_node_kwargs():
    graph, _ = REGISTRY["otb"].trace(INPUTS, ROLE_CLASSES)  # the default OTBConfig
    return graph.nodes["otb_advantage"]["node"].kwargs


def test_otb_zero_tail_is_on_by_default_as_verl():
    # one group, row 0 two tokens (reward 1 at the end), row 1 one token (reward 0): G = [[1, 1], [0, -]]
    # pi = .5, sum pi^2 = .5: w = .5, W = [[.5, 1], [.5, -]]; B_0 = (1 * .5 + 0 * .5) / 1 = .5
    # t=1: row 0 alone, B_1 = 1 = its own return (A = 0); zero tail (second-longest length 1) sets B_1 = 0 -> A = 1
    batch = otb_batch(torch.tensor([[0.0, 1.0], [0.0, float("nan")]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
                      torch.tensor([0, 0]), torch.full((2, 2), 0.5).log(), torch.full((2, 2), 0.5))
    kwargs = otb_node_kwargs()
    assert kwargs == {"handle_zero_tail": True}
    expected = torch.tensor([[0.5, 1.0], [-0.5, 0.0]])  # zero tail off: [[.5, 0], [-.5, 0]]
    assert torch.allclose(stages.otb_advantage(batch.clone(), **kwargs)["advantages"], expected)
    assert torch.allclose(stages.otb_advantage(batch.clone())["advantages"], expected)
    defaults = {inspect.signature(stages.otb_advantage.fn).parameters["handle_zero_tail"].default,
                inspect.signature(optimal_token_baseline).parameters["handle_zero_tail"].default,
                REGISTRY["otb"].make_config({}).handle_zero_tail}
    assert defaults == {True}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_otb_default_matches_verl_with_interior_gaps(seed):
    g = torch.Generator().manual_seed(seed)
    rows, width = 12, 7
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width) < lengths.unsqueeze(-1)).float()
    mask = mask * (torch.rand(rows, width, generator=g) > 0.3).float()  # observation spans inside responses
    mask[:, 0] = 1.0
    group = torch.arange(rows) // 3
    rewards = torch.randn(rows, width, generator=g)
    old = -torch.rand(rows, width, generator=g) * 3
    spp = torch.rand(rows, width, generator=g) * 0.5 + 0.1
    adv = stages.otb_advantage(otb_batch(rewards, mask, group, old, spp), **otb_node_kwargs())["advantages"]
    assert torch.allclose(adv, verl.optimal_token_baseline(rewards, mask, group, old, spp), atol=1e-5)


def config(tmp_path, *overrides):
    return load_run_config(None, [f"train.output_dir={tmp_path}", "train.batch_size=8", *overrides])


@pytest.mark.parametrize("algorithm", NEW)
def test_each_new_algorithm_trains_on_the_real_engines(tmp_path, algorithm):
    history = train(config(tmp_path, f"algorithm={algorithm}", "train.steps=2", "checkpoint.every=0"), progress=False)
    assert len(history) == 2
    assert math.isfinite(history[-1]["actor/pg_loss"]) and math.isfinite(history[-1]["actor/grad_norm"])


def test_adaptive_kl_coefficient_survives_a_resume(tmp_path):
    run = ["algorithm=ppo", "algo.kl_ctrl=adaptive", "algo.horizon=16", "train.steps=4", "checkpoint.every=2"]
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

    assert losses.sapo_loss().term("pg_loss").objective.keywords == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert losses.sapo_loss().loss_agg_mode == losses.gmpo_loss().loss_agg_mode == "seq-mean-token-mean"
    assert losses.gmpo_loss().term("pg_loss").objective.func is policy_gradient.gmpo
    assert losses.clip_cov_loss().term("pg_loss").objective.keywords == {"clip_low": 0.2, "clip_high": 0.2,
                                                                         "cov_ratio": 2e-4, "cov_lb": 1.0, "cov_ub": 5.0}
    assert losses.kl_cov_loss().term("pg_loss").objective.func is cov_loss.kl_cov
    assert losses.reinforce_loss().term("pg_loss").objective is policy_gradient.reinforce
    assert losses.ppo_loss(kl_coef=0.1, kl_kind="k3+").term("kl_loss").kind == "k3+"
    assert losses.ppo_loss(loss_agg_mode="token-sum").combine == "sum"
    assert losses.value_loss(loss_agg_mode="token-sum").combine == "sum"
    assert losses.sapo_loss().combine == losses.value_loss().combine == "mean"
    with pytest.raises(ValueError, match="loss_agg_mode"):
        losses.ppo_loss(loss_agg_mode="token-total")
    assert REGISTRY["dppo"].make_config({}).ratio_cap == 3.0  # verl's clip_ratio_c default
