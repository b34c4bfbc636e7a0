"""DPPO (arXiv:2602.04879): GRPO's graph with a divergence trust region (binary TV or KL) instead of ratio clipping."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.correction import RolloutCorrectionConfig
from flowrl.rl.subgraphs import critic_free_step
from flowrl.rl.ops.aggregate import AggMode

DIVERGENCE_LOSSES = {"tv": losses.dppo_tv_loss, "kl": losses.dppo_kl_loss}


class DPPOConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group_size: int = Field(8, ge=2, description="Responses sampled per prompt.")
    divergence: Literal["tv", "kl"] = Field("tv", description="Trust-region divergence of the sampled token: "
                                                              "'tv' (p - q) or 'kl' (binary KL).")
    clip_low: float = Field(0.15, ge=0, le=1, description="Divergence bound for tokens with A <= 0 "
                                                          "(verl's binary-KL example uses 0.05).")
    clip_high: float = Field(0.15, ge=0, le=1, description="Divergence bound for tokens with A > 0.")
    ratio_cap: float = Field(3.0, ge=1, description="Truncation of the detached IS ratio: verl's clip_ratio_c, "
                                                    "default 3.0 (its DPPO example and the paper use a large "
                                                    "cap, 1e4).")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL-to-reference loss; 0 drops the ref role.")
    loss_agg_mode: AggMode = Field("token-mean", description="How token losses are averaged (flowrl.rl.ops.aggregate).")
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig,
                                                        description="Truncated IS / rejection against the "
                                                                    "sampler's logprobs (verl's rollout correction).")


@fl.algorithm(config=DPPOConfig)
def dppo(batch, actor, rollout, ref, reward, cfg):
    make_loss = DIVERGENCE_LOSSES[cfg.divergence]
    loss = make_loss(clip_low=cfg.clip_low, clip_high=cfg.clip_high, ratio_cap=cfg.ratio_cap, kl_coef=cfg.kl_coef,
                     kl_kind="k3", loss_agg_mode=cfg.loss_agg_mode, rollout_correction=cfg.rollout_correction.build())
    return critic_free_step(batch, actor, rollout, ref, reward, n=cfg.group_size,
                            advantage=stages.group_advantage, loss=loss)
