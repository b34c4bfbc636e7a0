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
    loss = losses.SAPOGate.build(cfg, kl_coef=cfg.kl_coef, rollout_correction=cfg.rollout_correction.build())
    return critic_free_step(batch, actor, rollout, ref, reward, n=cfg.group_size, advantage=stages.group_advantage,
                            loss=loss)
