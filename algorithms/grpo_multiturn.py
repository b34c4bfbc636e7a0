"""Multi-turn GRPO: episodes in rollout.env (tool calls, observations out of the loss), scored by the environment."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, KLLoss


class GRPOMultiTurnConfig(losses.PPOClip, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")
    norm_by_std: bool = Field(True, description="Divide by the group's std; False gives Dr.GRPO.")


@fl.algorithm(config=GRPOMultiTurnConfig)
def grpo_multiturn(batch, actor, rollout, ref, cfg):
    batch = rollout.interact(batch, n=cfg.group_size)  # the environment's rewards land in `scores`
    batch = actor.logprobs(batch)
    loss = losses.PPOClip.build(cfg, kl_coef=cfg.kl_coef, rollout_correction=cfg.rollout_correction.build())
    if cfg.kl_coef > 0:
        batch = ref.logprobs(batch)
    batch = stages.group_advantage.options(norm_by_std=cfg.norm_by_std)(batch)
    return actor.update(batch, loss=loss)
