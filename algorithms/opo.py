"""OPO (arXiv:2505.23585): the group's length-weighted mean score as baseline, no std, no KL; exact on-policy
training is roles.actor.mini_batch_size = the step's rows (one optimizer step per batch)."""

from pydantic import ConfigDict

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, KLLoss
from flowrl.rl.subgraphs import critic_free_step


class OPOConfig(losses.PPOClip, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")


@fl.algorithm(config=OPOConfig)
def opo(batch, actor, rollout, ref, reward, cfg):
    return critic_free_step(batch, actor, rollout, ref, reward, cfg, advantage=stages.opo_advantage)
