"""GMPO (arXiv:2507.20673): GRPO's advantages with the geometric mean of sign-clipped token ratios per sequence."""

from pydantic import ConfigDict

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, KLLoss
from flowrl.rl.subgraphs import critic_free_step


class GMPOConfig(losses.GeometricMean, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")


@fl.algorithm(config=GMPOConfig)
def gmpo(batch, actor, rollout, ref, reward, cfg):
    return critic_free_step(batch, actor, rollout, ref, reward, cfg, advantage=stages.group_advantage)
