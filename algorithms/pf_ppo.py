"""PF-PPO (arXiv:2409.06957): PPO whose batch is redrawn by reward before the updates, filtering noisy samples."""

from typing import Literal

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import KLReward, Sampled


class PFPPOConfig(losses.PPOClip, losses.ValueClip, Sampled, KLReward):
    model_config = ConfigDict(extra="forbid")
    reweight_method: Literal["pow", "max_min", "max_random"] = Field(
        "pow", description="Row weight from its score: |s|^weight_pow, 1 at the batch's max or min score, or "
                           ".4 at the max and .1 elsewhere.")
    weight_pow: float = Field(2.0, description="Exponent of the 'pow' method.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")


@fl.algorithm(config=PFPPOConfig)
def pf_ppo(batch, actor, rollout, ref, critic, reward, cfg):
    batch = rollout.generate(batch)
    batch = reward.score(batch)
    batch = actor.logprobs(batch)
    if cfg.kl_coef > 0:
        batch = ref.logprobs(batch)
    batch = critic.values(batch)
    batch = stages.token_rewards(batch, kl_coef=cfg.kl_coef)
    batch = stages.gae_advantage(batch, gamma=cfg.gamma, lam=cfg.lam)
    batch = stages.pf_ppo_resample(batch, method=cfg.reweight_method, weight_pow=cfg.weight_pow)
    batch = critic.update(batch, loss=losses.ValueClip.build(cfg))
    loss = losses.PPOClip.build(cfg, rollout_correction=cfg.rollout_correction.build())
    return actor.update(batch, loss=loss)
