"""KL-Cov (arXiv:2505.22617): GRPO's advantages, no ratio clip, a |log r| penalty on the top-covariance tokens."""

from pydantic import ConfigDict

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, KLLoss
from flowrl.rl.subgraphs import critic_free_step


class KLCovConfig(losses.KLCov, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")


@fl.algorithm(config=KLCovConfig)
def kl_cov(batch, actor, rollout, ref, reward, cfg):
    return critic_free_step(batch, actor, rollout, ref, reward, cfg, advantage=stages.group_advantage)
