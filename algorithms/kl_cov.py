"""KL-Cov (arXiv:2505.22617): GRPO's advantages, no ratio clip, a |log r| penalty on the top-covariance tokens."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.correction import RolloutCorrectionConfig
from flowrl.rl.subgraphs import critic_free_step


class KLCovConfig(losses.KLCov):
    model_config = ConfigDict(extra="forbid")
    group_size: int = Field(8, ge=2, description="Responses sampled per prompt.")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL-to-reference loss; 0 drops the ref role.")
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig,
                                                        description="Truncated IS / rejection against the "
                                                                    "sampler's logprobs (verl's rollout correction).")


@fl.algorithm(config=KLCovConfig)
def kl_cov(batch, actor, rollout, ref, reward, cfg):
    loss = losses.KLCov.build(cfg, kl_coef=cfg.kl_coef, rollout_correction=cfg.rollout_correction.build())
    return critic_free_step(batch, actor, rollout, ref, reward, n=cfg.group_size, advantage=stages.group_advantage,
                            loss=loss)
