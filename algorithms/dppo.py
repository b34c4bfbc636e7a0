"""DPPO (arXiv:2602.04879): GRPO's graph with a divergence trust region (binary TV or KL) instead of ratio clipping."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, KLLoss
from flowrl.rl.subgraphs import critic_free_step


class DPPOConfig(losses.TrustRegion, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")
    ratio_cap: float = Field(3.0, ge=1, description="Truncation of the detached IS ratio: verl's clip_ratio_c, "
                                                    "default 3.0 (its DPPO example and the paper use a large "
                                                    "cap, 1e4).")


@fl.algorithm(config=DPPOConfig)
def dppo(batch, actor, rollout, ref, reward, cfg):
    loss = losses.TrustRegion.build(cfg, kl_coef=cfg.kl_coef, rollout_correction=cfg.rollout_correction.build())
    return critic_free_step(batch, actor, rollout, ref, reward, n=cfg.group_size,
                            advantage=stages.group_advantage, loss=loss)
