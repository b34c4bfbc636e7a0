"""Multi-turn GRPO: episodes in rollout.env (tool calls, observations out of the loss), scored by the environment."""

from pydantic import BaseModel, ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.correction import RolloutCorrectionConfig
from flowrl.rl.ops.aggregate import AggMode


class GRPOMultiTurnConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group_size: int = Field(8, ge=2, description="Episodes played per prompt.")
    clip: float = Field(0.2, gt=0, lt=1, description="PPO clip range, the same on both sides.")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL-to-reference loss; 0 drops the ref role.")
    norm_by_std: bool = Field(True, description="Divide by the group's std; False gives Dr.GRPO.")
    loss_agg_mode: AggMode = Field("token-mean", description="How token losses are averaged over the model's own "
                                                             "tokens (loss_mask).")
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig,
                                                        description="Truncated IS / rejection against the "
                                                                    "sampler's logprobs (verl's rollout correction).")


@fl.algorithm(config=GRPOMultiTurnConfig)
def grpo_multiturn(batch, actor, rollout, ref, cfg):
    batch = rollout.interact(batch, n=cfg.group_size)  # the environment's rewards land in `scores`
    batch = actor.logprobs(batch)
    loss = losses.clip_higher_loss(clip_low=cfg.clip, clip_high=cfg.clip, kl_coef=cfg.kl_coef, kl_kind="k3",
                                   loss_agg_mode=cfg.loss_agg_mode, rollout_correction=cfg.rollout_correction.build())
    if cfg.kl_coef > 0:
        batch = ref.logprobs(batch)
    batch = stages.group_advantage.options(norm_by_std=cfg.norm_by_std)(batch)
    return actor.update(batch, loss=loss)
