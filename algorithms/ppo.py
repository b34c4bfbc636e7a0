"""PPO (Ouyang et al.): a critic, GAE, KL to the reference in the reward (fixed or adaptive weight), dual-clip
policy loss."""

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import KLReward, Sampled


class PPOConfig(losses.PPOClip, losses.ValueClip, Sampled, KLReward):
    model_config = ConfigDict(extra="forbid")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    kl_ctrl: Literal["fixed", "adaptive"] = Field("fixed", description="'adaptive' moves the KL weight, from kl_coef, "
                                                  "toward target_kl each step (verl's kl_ctrl.type).")
    target_kl: float = Field(0.1, gt=0, description="The adaptive controller's target KL per token.")
    horizon: int = Field(10000, gt=0, description="The adaptive controller's horizon, in rows (verl's kl_ctrl).")

    @model_validator(mode="after")
    def _adaptive_needs_a_weight(self) -> "PPOConfig":
        if self.kl_ctrl == "adaptive" and self.kl_coef == 0:
            raise ValueError("kl_ctrl: 'adaptive' scales kl_coef, which is 0; set kl_coef > 0")
        return self


@fl.algorithm(config=PPOConfig)
def ppo(batch, actor, rollout, ref, critic, reward, kl_ctrl, cfg):
    batch = rollout.generate(batch)
    batch = reward.score(batch)
    batch = actor.logprobs(batch)
    if cfg.kl_coef > 0:
        batch = ref.logprobs(batch)
    batch = critic.values(batch)
    if cfg.kl_ctrl == "adaptive":
        batch = kl_ctrl.token_rewards(batch, init_coef=cfg.kl_coef, target_kl=cfg.target_kl, horizon=cfg.horizon)
    else:
        batch = stages.token_rewards(batch, kl_coef=cfg.kl_coef)
    batch = stages.gae_advantage(batch, gamma=cfg.gamma, lam=cfg.lam)
    batch = critic.update(batch, loss=losses.ValueClip.build(cfg))
    loss = losses.PPOClip.build(cfg, rollout_correction=cfg.rollout_correction.build())
    return actor.update(batch, loss=loss)
