"""RLOO: leave-one-out baselines over each prompt's samples, PPO clip, KL to the reference as a loss."""

from pydantic import ConfigDict

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GRPOKL, GroupSampling, GroupSize
from flowrl.rl.subgraphs import critic_free_step


class RLOOConfig(losses.PPOClip, GroupSampling, GRPOKL):
    model_config = ConfigDict(extra="forbid")
    group_size: GroupSize = 4
    dual_clip: losses.DualClip = None
    loss_agg_mode: losses.LossAggMode = "seq-mean-token-mean"


@fl.algorithm(config=RLOOConfig)
def rloo(batch, actor, rollout, ref, reward, cfg):
    return critic_free_step(batch, actor, rollout, ref, reward, cfg, advantage=stages.rloo_advantage)
