"""GRPO for pass@k (arXiv:2503.19595): only each group's best sample learns, from best minus second-best score."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, KLLoss, KLLossCoef
from flowrl.rl.subgraphs import critic_free_step


class GRPOPassKConfig(losses.PPOClip, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")
    kl_coef: KLLossCoef = 0.001
    norm_by_std: bool = Field(True, description="Divide the best sample's advantage by its group's std.")


@fl.algorithm(config=GRPOPassKConfig)
def grpo_passk(batch, actor, rollout, ref, reward, cfg):
    advantage = stages.passk_advantage.options(norm_by_std=cfg.norm_by_std)
    loss = losses.PPOClip.build(cfg, kl_coef=cfg.kl_coef, rollout_correction=cfg.rollout_correction.build())
    return critic_free_step(batch, actor, rollout, ref, reward, n=cfg.group_size, advantage=advantage, loss=loss)
