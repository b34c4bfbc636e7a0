"""GRPO (DeepSeekMath): group-normalized scores, a symmetric clip, KL to the reference as a loss."""

from pydantic import BaseModel, ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.correction import RolloutCorrectionConfig
from flowrl.rl.subgraphs import critic_free_step
from flowrl.rl.ops.aggregate import AggMode


class GRPOConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group_size: int = Field(8, ge=2, description="Responses sampled per prompt.")
    clip: float = Field(0.2, gt=0, lt=1, description="PPO clip range, the same on both sides.")
    kl_coef: float = Field(0.001, ge=0, description="Weight of the k3 KL-to-reference loss; 0 drops the ref role.")
    norm_by_std: bool = Field(True, description="Divide by the group's std; False gives Dr.GRPO.")
    loss_agg_mode: AggMode = Field("token-mean", description="How token losses are averaged (flowrl.rl.ops.aggregate).")
    entropy_coef: float = Field(0.0, description="Entropy bonus weight.")
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig,
                                                        description="Truncated IS / rejection against the "
                                                                    "sampler's logprobs (verl's rollout correction).")


@fl.algorithm(config=GRPOConfig)
def grpo(batch, actor, rollout, ref, reward, cfg):
    advantage = stages.group_advantage.options(norm_by_std=cfg.norm_by_std)
    loss = losses.clip_higher_loss(clip_low=cfg.clip, clip_high=cfg.clip, kl_coef=cfg.kl_coef, kl_kind="k3",
                                   loss_agg_mode=cfg.loss_agg_mode, entropy_coef=cfg.entropy_coef,
                                   rollout_correction=cfg.rollout_correction.build())
    return critic_free_step(batch, actor, rollout, ref, reward, n=cfg.group_size, advantage=advantage, loss=loss)
