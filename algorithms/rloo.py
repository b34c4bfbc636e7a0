"""RLOO: leave-one-out baselines over each prompt's samples, PPO clip, KL to the reference as a loss."""

from pydantic import ConfigDict

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, GroupSize, KLLoss, KLLossCoef
from flowrl.rl.subgraphs import critic_free_step


class RLOOConfig(losses.PPOClip, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")
    group_size: GroupSize = 4
    kl_coef: KLLossCoef = 0.001
    dual_clip: losses.DualClip = None
    loss_agg_mode: losses.LossAggMode = "seq-mean-token-mean"


@fl.algorithm(config=RLOOConfig)
def rloo(batch, actor, rollout, ref, reward, cfg):
    loss = losses.PPOClip.build(cfg, kl_coef=cfg.kl_coef, rollout_correction=cfg.rollout_correction.build())
    return critic_free_step(batch, actor, rollout, ref, reward, n=cfg.group_size, advantage=stages.rloo_advantage,
                            loss=loss)
