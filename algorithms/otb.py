"""OTB, the optimal token baseline (verl's `optimal_token_baseline`): each group's baseline at step t is its
returns weighted by the cumulative 1 - 2 pi + sum pi^2 (the policy's sum of squared probabilities, from the
actor's forward); no critic."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, KLLoss


class OTBConfig(losses.PPOClip, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")
    handle_zero_tail: bool = Field(True, description="Baseline 0 on a group's single longest row past the "
                                                     "second-longest row's length, where the baseline would be "
                                                     "that row's own return (verl's default: on).")


@fl.algorithm(config=OTBConfig)
def otb(batch, actor, rollout, ref, reward, cfg):
    batch = rollout.generate(batch, n=cfg.group_size)
    batch = reward.score(batch)
    batch = actor.logprobs(batch, outputs=("sum_pi_squared",))
    if cfg.kl_coef > 0:
        batch = ref.logprobs(batch)
    batch = stages.token_rewards(batch)
    batch = stages.otb_advantage(batch, handle_zero_tail=cfg.handle_zero_tail)
    return actor.update(batch, loss=cfg.loss())
