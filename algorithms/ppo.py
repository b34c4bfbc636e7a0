"""PPO (Ouyang et al.): a critic, GAE, KL to the reference in the reward, dual-clip policy loss."""

from pydantic import BaseModel, ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.correction import RolloutCorrectionConfig


class PPOConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    clip: float = Field(0.2, gt=0, lt=1, description="Policy clip range.")
    dual_clip: float | None = Field(3.0, gt=1, description="Dual-clip bound for negative advantages; None is off.")
    value_clip: float = Field(0.5, gt=0, description="Value-function clip range.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    kl_coef: float = Field(0.001, ge=0, description="KL-in-reward weight; 0 drops the ref role.")
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig,
                                                        description="Truncated IS / rejection against the "
                                                                    "sampler's logprobs (verl's rollout correction).")


@fl.algorithm(config=PPOConfig)
def ppo(batch, actor, rollout, ref, critic, reward, cfg):
    batch = rollout.generate(batch)
    batch = reward.score(batch)
    batch = actor.logprobs(batch)
    if cfg.kl_coef > 0:
        batch = ref.logprobs(batch)
    batch = critic.values(batch)
    batch = stages.token_rewards(batch, kl_coef=cfg.kl_coef)
    batch = stages.gae_advantage(batch, gamma=cfg.gamma, lam=cfg.lam)
    batch = critic.update(batch, loss=losses.ValueLoss(clip=cfg.value_clip))
    loss = losses.ppo_loss(clip=cfg.clip, dual_clip=cfg.dual_clip, rollout_correction=cfg.rollout_correction.build())
    return actor.update(batch, loss=loss)
