"""GRPO (DeepSeekMath): group-normalized scores, a symmetric clip, KL to the reference as a loss."""

import flowrl as fl
from flowrl.rl import stages
from flowrl.rl.algorithm_configs import GRPOConfig
from flowrl.rl.subgraphs import critic_free_step

__all__ = ["GRPOConfig", "grpo"]


@fl.algorithm(config=GRPOConfig)
def grpo(batch, actor, rollout, ref, reward, cfg):
    advantage = stages.group_advantage.options(norm_by_std=cfg.norm_by_std)
    return critic_free_step(batch, actor, rollout, ref, reward, cfg, advantage=advantage)
