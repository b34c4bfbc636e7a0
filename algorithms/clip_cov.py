"""Clip-Cov (arXiv:2505.22617): GRPO with a few high-covariance tokens' gradients dropped against entropy collapse."""

from pydantic import BaseModel, ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.correction import RolloutCorrectionConfig
from flowrl.rl.subgraphs import critic_free_step


class ClipCovConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group_size: int = Field(8, ge=2, description="Responses sampled per prompt.")
    clip: float = Field(0.2, gt=0, lt=1, description="PPO clip range, the same on both sides.")
    cov_ratio: float = Field(2e-4, gt=0, le=1, description="Share of valid tokens whose gradient is dropped.")
    cov_lb: float = Field(1.0, description="Only tokens with covariance above this are candidates.")
    cov_ub: float = Field(5.0, description="Only tokens with covariance below this are candidates.")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL-to-reference loss; 0 drops the ref role.")
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig,
                                                        description="Truncated IS / rejection against the "
                                                                    "sampler's logprobs (verl's rollout correction).")


@fl.algorithm(config=ClipCovConfig)
def clip_cov(batch, actor, rollout, ref, reward, cfg):
    loss = losses.clip_cov_loss(clip_low=cfg.clip, clip_high=cfg.clip, cov_ratio=cfg.cov_ratio, cov_lb=cfg.cov_lb,
                                cov_ub=cfg.cov_ub, kl_coef=cfg.kl_coef, kl_kind="k3",
                                rollout_correction=cfg.rollout_correction.build())
    return critic_free_step(batch, actor, rollout, ref, reward, n=cfg.group_size, advantage=stages.group_advantage,
                            loss=loss)
