"""SAPO (Qwen, arXiv:2511.20347): GRPO's advantages with a smooth sigmoid gate on the ratio instead of a clip."""

from pydantic import ConfigDict

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, KLLoss
from flowrl.rl.subgraphs import critic_free_step


class SAPOConfig(losses.SAPOGate, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")


@fl.algorithm(config=SAPOConfig)
def sapo(batch, actor, rollout, ref, reward, cfg):
    return critic_free_step(batch, actor, rollout, ref, reward, cfg, advantage=stages.group_advantage)
