"""OPO (arXiv:2505.23585): the group's length-weighted mean score as baseline, no std, no KL; exact on-policy
training is train.mini_batch_size = the step's rows (one optimizer step per batch)."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.correction import RolloutCorrectionConfig
from flowrl.rl.subgraphs import critic_free_step


class OPOConfig(losses.PPOClip):
    model_config = ConfigDict(extra="forbid")
    group_size: int = Field(8, ge=2, description="Responses sampled per prompt.")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL-to-reference loss; 0 (OPO's) drops the ref "
                                                  "role.")
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig,
                                                        description="Truncated IS / rejection against the "
                                                                    "sampler's logprobs (verl's rollout correction).")


@fl.algorithm(config=OPOConfig)
def opo(batch, actor, rollout, ref, reward, cfg):
    loss = losses.PPOClip.build(cfg, kl_coef=cfg.kl_coef, rollout_correction=cfg.rollout_correction.build())
    return critic_free_step(batch, actor, rollout, ref, reward, n=cfg.group_size, advantage=stages.opo_advantage,
                            loss=loss)
