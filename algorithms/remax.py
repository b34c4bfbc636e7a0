"""ReMax (arXiv:2310.10505): REINFORCE with the greedy rollout's score as each prompt's baseline."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import Sampled


class ReMaxConfig(losses.PPOClip, Sampled):
    model_config = ConfigDict(extra="forbid")
    group_size: int = Field(4, ge=1, description="Sampled responses per prompt besides the greedy one "
                                                 "(1 is the paper's setting).")


@fl.algorithm(config=ReMaxConfig)
def remax(batch, actor, rollout, reward, cfg):
    batch = rollout.generate(batch, greedy=True)
    batch = reward.score(batch, metric="baseline")
    batch = stages.keep_as_baseline(batch)
    batch = rollout.generate(batch, n=cfg.group_size)
    batch = reward.score(batch)
    batch = actor.logprobs(batch)
    batch = stages.remax_advantage(batch)
    return actor.update(batch, loss=cfg.loss())
