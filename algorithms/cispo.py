"""CISPO (MiniMax-M1, arXiv:2506.13585): GRPO's graph with a clipped, detached IS weight on every token."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, KLLoss
from flowrl.rl.subgraphs import critic_free_step


class CISPOConfig(losses.CISPOClip, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")
    norm_by_std: bool = Field(True, description="Divide by the group's std; False gives Dr.GRPO advantages.")


@fl.algorithm(config=CISPOConfig)
def cispo(batch, actor, rollout, ref, reward, cfg):
    advantage = stages.group_advantage.options(norm_by_std=cfg.norm_by_std)
    return critic_free_step(batch, actor, rollout, ref, reward, cfg, advantage=advantage)
