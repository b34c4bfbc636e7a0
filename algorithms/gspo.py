"""GSPO (Qwen, arXiv:2507.18071): GRPO's graph with clipping on the sequence-level ratio, no KL by default."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, KLLoss
from flowrl.rl.subgraphs import critic_free_step


class GSPOConfig(losses.GSPOClip, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")
    norm_by_std: bool = Field(True, description="Divide by the group's std; False gives Dr.GRPO advantages.")


@fl.algorithm(config=GSPOConfig)
def gspo(batch, actor, rollout, ref, reward, cfg):
    advantage = stages.group_advantage.options(norm_by_std=cfg.norm_by_std)
    return critic_free_step(batch, actor, rollout, ref, reward, cfg, advantage=advantage)
