"""Deferring old logprobs to a single-step update gives the same step as computing them first."""

import torch

from flowrl.engines.hf.configs import HFRolloutConfig, HFTrainConfig
from flowrl.rl import losses
from flowrl.data.batch import prompt_batch
from flowrl.engines.hf.rollout import HFRolloutEngine
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.graph.trace import Deferred
from flowrl.roles import Actor, UpdateSettings


def rollout_batch(path):
    tok = load_tokenizer(path)
    prompts = prompt_batch([tok.encode(t, add_special_tokens=False) for t in ("1+2=", "3+4=", "12+3=")],
                           tok.pad_token_id, uids=[0, 1, 2])
    out = HFRolloutEngine(load_causal_lm(path), tok, HFRolloutConfig()).generate(prompts["prompt_ids"], prompts["prompt_mask"],
                                                              SamplingParams(max_new_tokens=3), seed=0)
    prompts["response_ids"], prompts["response_mask"] = out["response_ids"], out["response_mask"]
    prompts["loss_mask"] = out["response_mask"]
    prompts["advantages"] = torch.tensor([1.0, -0.5, 0.25])[:, None] * out["response_mask"]
    return prompts


def step(path, batch, deferred, mini_batch_size=8):
    """One update, the old logprobs deferred into it (as the plan folds actor.logprobs) or computed first."""
    torch.manual_seed(0)
    actor = Actor(engine=HFTrainEngine(load_causal_lm(path), HFTrainConfig(lr=1e-2), kind="actor"),
                  settings=UpdateSettings(mini_batch_size=mini_batch_size, micro_batch_size=2))
    batch = batch.clone()
    if deferred:
        actor.update(batch, loss=losses.ppo_loss(), deferred=Deferred("logprobs"))
    else:
        actor.update(actor.logprobs(batch), loss=losses.ppo_loss())
    return batch, actor.engine.model.state_dict()


def test_deferred_old_logprobs_match_computed_ones(tiny_model_path):
    batch = rollout_batch(tiny_model_path)
    deferred, params_deferred = step(tiny_model_path, batch, deferred=True)
    computed, params_computed = step(tiny_model_path, batch, deferred=False)
    assert "old_logprobs" not in deferred.keys()  # never computed, nor left as a placeholder
    assert not computed["old_logprobs"].isnan().any()
    initial = load_causal_lm(tiny_model_path).state_dict()
    assert any(not torch.equal(initial[k], v) for k, v in params_computed.items())  # the step moved weights
    for key, value in params_computed.items():
        torch.testing.assert_close(params_deferred[key], value, atol=1e-6, rtol=0)


def test_a_deferred_update_of_several_steps_computes_them_first(tiny_model_path):
    batch = rollout_batch(tiny_model_path)
    deferred, params_deferred = step(tiny_model_path, batch, deferred=True, mini_batch_size=2)
    computed, params_computed = step(tiny_model_path, batch, deferred=False, mini_batch_size=2)
    assert "old_logprobs" not in deferred.keys()  # computed on a copy for the update
    for key, value in params_computed.items():  # the same forward pass, at the same weights: the same step
        torch.testing.assert_close(params_deferred[key], value, atol=0, rtol=0)
