"""Asynchronous GRPO: GRPO whose generation runs up to `max_staleness` steps ahead of training.

`fl.buffer` splits the step: with the rollout on its own pool, step t+k's prompts are sampled and scored while
step t trains (k = 1 is verl's one-step-off-policy). The loss treats the sampler's logprobs as the behaviour
policy: token-level truncated importance weights pi_old / pi_rollout (the rollout correction) multiply the
clipped ratio pi / pi_old, as in AReaL's decoupled PPO objective.
"""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import stages
from flowrl.rl.algorithm_configs import GRPOConfig
from flowrl.rl.correction import RolloutCorrectionConfig


class GRPOAsyncConfig(GRPOConfig):
    model_config = ConfigDict(extra="forbid")
    max_staleness: int = Field(1, ge=0, description="Steps generation may run ahead of training (versions a "
                                                    "trained row may lag the weights); 0 is synchronous GRPO.")
    stream: bool = Field(False, description="Sample each response on its own and train on the first groups to "
                                            "finish, max_staleness bounding each sample's versions "
                                            "(flowrl.runtime.offpolicy.streaming; roles.rollout.max_in_flight, .partial).")
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=lambda: RolloutCorrectionConfig(is_level="token"),
        description="Importance weights against the sampler's (lagging) logprobs; token-level truncated IS by "
                    "default (verl's rollout correction).")


@fl.algorithm(config=GRPOAsyncConfig)
def grpo_async(batch, actor, rollout, ref, reward, cfg):
    batch = rollout.generate(batch, n=cfg.group_size)
    batch = reward.score(batch)
    batch = fl.buffer(batch, max_staleness=cfg.max_staleness, stream=cfg.stream)
    loss = cfg.loss()
    batch = actor.logprobs(batch)
    if "ref_logprobs" in loss.reads:
        batch = ref.logprobs(batch)
    batch = stages.group_advantage(batch, norm_by_std=cfg.norm_by_std)
    return actor.update(batch, loss=loss)
