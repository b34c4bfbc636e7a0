"""Clip-Cov (arXiv:2505.22617): GRPO with a few high-covariance tokens' gradients dropped against entropy collapse."""

from pydantic import ConfigDict

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, KLLoss
from flowrl.rl.subgraphs import critic_free_step


class ClipCovConfig(losses.ClipCov, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")


@fl.algorithm(config=ClipCovConfig)
def clip_cov(batch, actor, rollout, ref, reward, cfg):
    return critic_free_step(batch, actor, rollout, ref, reward, cfg, advantage=stages.group_advantage)
