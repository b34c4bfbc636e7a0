"""GRPO for pass@k (arXiv:2503.19595): only each group's best sample learns, from best minus second-best score."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import stages
from flowrl.rl.algorithm_configs import GRPOConfig
from flowrl.rl.subgraphs import critic_free_step


class GRPOPassKConfig(GRPOConfig):
    model_config = ConfigDict(extra="forbid")
    norm_by_std: bool = Field(True, description="Divide the best sample's advantage by its group's std.")


@fl.algorithm(config=GRPOPassKConfig)
def grpo_passk(batch, actor, rollout, ref, reward, cfg):
    advantage = stages.passk_advantage.options(norm_by_std=cfg.norm_by_std)
    return critic_free_step(batch, actor, rollout, ref, reward, cfg, advantage=advantage)
