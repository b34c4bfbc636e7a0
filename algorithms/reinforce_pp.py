"""REINFORCE++ (arXiv:2501.03262): no critic, k1 KL to the reference in the token rewards, whitened returns."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import KLReward, Sampled


class ReinforcePPConfig(losses.PPOClip, Sampled, KLReward):
    model_config = ConfigDict(extra="forbid")
    group_size: int = Field(4, ge=1, description="Responses sampled per prompt (whitening is over the batch).")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount of the return-to-go.")


@fl.algorithm(config=ReinforcePPConfig)
def reinforce_pp(batch, actor, rollout, ref, reward, cfg):
    batch = rollout.generate(batch, n=cfg.group_size)
    batch = reward.score(batch)
    batch = actor.logprobs(batch)
    if cfg.kl_coef > 0:
        batch = ref.logprobs(batch)
    batch = cfg.token_rewards(batch)
    batch = stages.reinforce_pp_advantage(batch, gamma=cfg.gamma)
    return actor.update(batch, loss=cfg.loss())
