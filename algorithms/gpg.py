"""GPG (arXiv:2504.02546): group-centred scores scaled by the share of informative rows, plain -A * logp loss."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling, GroupSize, KLLoss
from flowrl.rl.subgraphs import critic_free_step


class GPGConfig(losses.GPG, GroupSampling, KLLoss):
    model_config = ConfigDict(extra="forbid")
    group_size: GroupSize = 5
    f_norm: float = Field(1.0, gt=0, description="Divisor of the advantages (GPG's F_norm).")


@fl.algorithm(config=GPGConfig)
def gpg(batch, actor, rollout, ref, reward, cfg):
    advantage = stages.gpg_advantage.options(f_norm=cfg.f_norm)
    return critic_free_step(batch, actor, rollout, ref, reward, cfg, advantage=advantage)
