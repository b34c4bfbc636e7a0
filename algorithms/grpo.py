"""GRPO (DeepSeekMath): group-normalized scores, a symmetric clip, KL to the reference as a loss."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, KLLoss, KLLossCoef
from flowrl.rl.subgraphs import critic_free_step


class GRPOConfig(losses.PPOClip, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")
    kl_coef: KLLossCoef = 0.001
    norm_by_std: bool = Field(True, description="Divide by the group's std; False gives Dr.GRPO.")


@fl.algorithm(config=GRPOConfig)
def grpo(batch, actor, rollout, ref, reward, cfg):
    advantage = stages.group_advantage.options(norm_by_std=cfg.norm_by_std)
    loss = losses.PPOClip.build(cfg, kl_coef=cfg.kl_coef, rollout_correction=cfg.rollout_correction.build())
    return critic_free_step(batch, actor, rollout, ref, reward, n=cfg.group_size, advantage=advantage, loss=loss)
