"""PF-PPO (arXiv:2409.06957): PPO whose batch is redrawn by reward before the updates, filtering noisy samples."""

from typing import Literal

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import stages
from flowrl.rl.algorithm_configs import ActorCriticConfig
from flowrl.rl.subgraphs import ppo_step


class PFPPOConfig(ActorCriticConfig):
    model_config = ConfigDict(extra="forbid")
    reweight_method: Literal["pow", "max_min", "max_random"] = Field(
        "pow", description="Row weight from its score: |s|^weight_pow, 1 at the batch's max or min score, or "
                           ".4 at the max and .1 elsewhere.")
    weight_pow: float = Field(2.0, description="Exponent of the 'pow' method.")


@fl.algorithm(config=PFPPOConfig)
def pf_ppo(batch, actor, rollout, ref, critic, reward, cfg):
    resample = stages.pf_ppo_resample.options(method=cfg.reweight_method, weight_pow=cfg.weight_pow)
    return ppo_step(batch, actor, rollout, ref, critic, reward, cfg, resample=resample)
