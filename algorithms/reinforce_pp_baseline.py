"""REINFORCE++-baseline (arXiv:2501.03262): the group mean as baseline, then batch whitening; no critic."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.correction import RolloutCorrectionConfig


class ReinforcePPBaselineConfig(losses.PPOClip):
    model_config = ConfigDict(extra="forbid")
    group_size: int = Field(8, ge=2, description="Responses sampled per prompt (the baseline is their mean).")
    kl_coef: float = Field(0.001, ge=0, description="Weight of the k1 KL-to-reference penalty in the token "
                                                    "rewards (verl's use_kl_in_reward); 0 drops the ref role.")
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig,
                                                        description="Truncated IS / rejection against the "
                                                                    "sampler's logprobs (verl's rollout correction).")


@fl.algorithm(config=ReinforcePPBaselineConfig)
def reinforce_pp_baseline(batch, actor, rollout, ref, reward, cfg):
    batch = rollout.generate(batch, n=cfg.group_size)
    batch = reward.score(batch)
    batch = actor.logprobs(batch)
    if cfg.kl_coef > 0:
        batch = ref.logprobs(batch)
    batch = stages.token_rewards(batch, kl_coef=cfg.kl_coef, kl_kind="k1")
    batch = stages.reinforce_pp_baseline_advantage(batch)
    return actor.update(batch, loss=losses.PPOClip.build(cfg, rollout_correction=cfg.rollout_correction.build()))
