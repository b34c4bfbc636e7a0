"""Reward-model training: a scalar head trained with the Bradley-Terry loss on chosen/rejected pairs.

Rows come from a preference data set (`chosen`, `rejected` and an optional `prompt`;
flowrl.data.conversations), each pair becoming two adjacent rows; the `learned_reward` role (the model
with a one-output head, the layout flowrl.roles.reward.RewardModel reads) minimises mean -log
sigmoid(s_chosen - s_rejected). The evaluation pass logs held-out pair accuracy (`eval/rm/accuracy`) on
data.val_files; the exported folder (output_dir/final) is a `model.reward_path` for GRPO and the others.
"""

from pydantic import BaseModel, ConfigDict, Field

import flowrl as fl
from flowrl.rl import sft_loss


class RMConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    center_coef: float = Field(0.0, ge=0, description="Weight of the mean squared score (reward centering, "
                               "arXiv:2312.09244), keeping scores near 0; 0: plain Bradley-Terry.")


@fl.algorithm
def rm_eval(batch, conversations, learned_reward):
    batch = conversations.encode_pairs(batch)
    batch = learned_reward.scores(batch)
    return sft_loss.preference_metrics(batch, metric="eval/rm")


@fl.algorithm(config=RMConfig, evaluation=rm_eval)
def rm(batch, conversations, learned_reward, cfg):
    batch = conversations.encode_pairs(batch)
    return learned_reward.update(batch, loss=sft_loss.BradleyTerryLoss(cfg.center_coef))
