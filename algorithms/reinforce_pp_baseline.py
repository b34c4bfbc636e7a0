"""REINFORCE++-baseline (arXiv:2501.03262): the group mean as baseline, then batch whitening; no critic."""

from pydantic import ConfigDict

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, KLReward


class ReinforcePPBaselineConfig(losses.PPOClip, GroupSampling, KLReward):
    model_config = ConfigDict(extra="forbid")


@fl.algorithm(config=ReinforcePPBaselineConfig)
def reinforce_pp_baseline(batch, actor, rollout, ref, reward, cfg):
    batch = rollout.generate(batch, n=cfg.group_size)
    batch = reward.score(batch)
    batch = actor.logprobs(batch)
    if cfg.kl_coef > 0:
        batch = ref.logprobs(batch)
    batch = cfg.token_rewards(batch)
    batch = stages.reinforce_pp_baseline_advantage(batch)
    return actor.update(batch, loss=cfg.loss())
