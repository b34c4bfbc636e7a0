"""RLOO: leave-one-out baselines over each prompt's samples, PPO clip, KL to the reference as a loss."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.correction import RolloutCorrectionConfig
from flowrl.rl.subgraphs import critic_free_step
from flowrl.rl.ops.aggregate import AggMode


class RLOOConfig(losses.PPOClip):
    model_config = ConfigDict(extra="forbid")
    group_size: int = Field(4, ge=2, description="Responses sampled per prompt (>= 2 for a baseline).")
    kl_coef: float = Field(0.001, ge=0, description="Weight of the k3 KL-to-reference loss; 0 drops the ref role.")
    dual_clip: float | None = Field(None, gt=1, description="Dual-clip bound for negative advantages; None "
                                                            "(RLOO's default) is off.")
    loss_agg_mode: AggMode = Field("seq-mean-token-mean", description="How token losses are averaged (RLOO's "
                                                                      "default: each sequence's mean).")
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig,
                                                        description="Truncated IS / rejection against the "
                                                                    "sampler's logprobs (verl's rollout correction).")


@fl.algorithm(config=RLOOConfig)
def rloo(batch, actor, rollout, ref, reward, cfg):
    loss = losses.PPOClip.build(cfg, kl_coef=cfg.kl_coef, rollout_correction=cfg.rollout_correction.build())
    return critic_free_step(batch, actor, rollout, ref, reward, n=cfg.group_size, advantage=stages.rloo_advantage,
                            loss=loss)
