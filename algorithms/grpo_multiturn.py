"""Multi-turn GRPO: episodes in rollout.env (tool calls, observations out of the loss), scored by the environment."""

from pydantic import ConfigDict

import flowrl as fl
from flowrl.rl import stages
from flowrl.rl.algorithm_configs import GRPOConfig
from flowrl.rl.options import KLLossCoef


class GRPOMultiTurnConfig(GRPOConfig):
    model_config = ConfigDict(extra="forbid")
    kl_coef: KLLossCoef = 0.0  # no reference model by default in multi-turn episodes


@fl.algorithm(config=GRPOMultiTurnConfig)
def grpo_multiturn(batch, actor, rollout, ref, cfg):
    batch = rollout.interact(batch, n=cfg.group_size)  # the environment's rewards land in `scores`
    batch = actor.logprobs(batch)
    loss = cfg.loss()
    if "ref_logprobs" in loss.reads:
        batch = ref.logprobs(batch)
    batch = stages.group_advantage.options(norm_by_std=cfg.norm_by_std)(batch)
    return actor.update(batch, loss=loss)
