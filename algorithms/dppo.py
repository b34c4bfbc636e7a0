"""DPPO (arXiv:2602.04879): GRPO's graph with a divergence trust region (binary TV or KL) instead of ratio clipping."""

from pydantic import ConfigDict

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, KLLoss
from flowrl.rl.subgraphs import critic_free_step


class DPPOConfig(losses.TrustRegion, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")
    ratio_cap: losses.RatioCap = 3.0  # verl's clip_ratio_c default (its DPPO example and the paper use 1e4)


@fl.algorithm(config=DPPOConfig)
def dppo(batch, actor, rollout, ref, reward, cfg):
    return critic_free_step(batch, actor, rollout, ref, reward, cfg, advantage=stages.group_advantage)
