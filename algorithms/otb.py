"""OTB, the optimal token baseline (verl's `optimal_token_baseline`): each group's baseline at step t is its
returns weighted by the cumulative 1 - 2 pi + sum pi^2 (the policy's sum of squared probabilities, from the
actor's forward); no critic."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.correction import RolloutCorrectionConfig


class OTBConfig(losses.PPOClip):
    model_config = ConfigDict(extra="forbid")
    group_size: int = Field(8, ge=2, description="Responses sampled per prompt (verl's OTB example: 8).")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL-to-reference loss; 0 (verl's OTB example) "
                                                  "drops the ref role.")
    handle_zero_tail: bool = Field(True, description="Baseline 0 on a group's single longest row past the "
                                                     "second-longest row's length, where the baseline would be "
                                                     "that row's own return (verl's default: on).")
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig,
                                                        description="Truncated IS / rejection against the "
                                                                    "sampler's logprobs (verl's rollout correction).")


@fl.algorithm(config=OTBConfig)
def otb(batch, actor, rollout, ref, reward, cfg):
    batch = rollout.generate(batch, n=cfg.group_size)
    batch = reward.score(batch)
    batch = actor.logprobs(batch, outputs=("sum_pi_squared",))
    if cfg.kl_coef > 0:
        batch = ref.logprobs(batch)
    batch = stages.token_rewards(batch)
    batch = stages.otb_advantage(batch, handle_zero_tail=cfg.handle_zero_tail)
    loss = losses.PPOClip.build(cfg, kl_coef=cfg.kl_coef, rollout_correction=cfg.rollout_correction.build())
    return actor.update(batch, loss=loss)
