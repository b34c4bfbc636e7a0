"""SFT: the actor trained on the assistant's tokens of chat conversations (verl's SFT trainer, as a graph).

Rows come from an SFT data set (`messages`, or `prompt` and `response` columns; flowrl.data.conversations),
the `conversations` role tokenizes them with the chat template and masks everything but the assistant's
tokens, and the actor's update minimises their token-mean NLL. The evaluation pass logs the held-out
loss (`eval/sft/loss`) on data.val_files.
"""

from pydantic import BaseModel, ConfigDict, Field

import flowrl as fl
from flowrl.rl import sft_loss
from flowrl.rl.ops.aggregate import AggMode


class SFTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    loss_agg_mode: AggMode = Field("token-mean", description="How token losses are averaged: token-mean over "
                                   "every assistant token (verl's SFT), or seq-mean-token-mean per conversation.")


@fl.algorithm
def sft_eval(batch, conversations, actor):
    batch = conversations.encode(batch)
    batch = actor.logprobs(batch)
    return sft_loss.nll_metrics(batch, metric="eval/sft")


@fl.algorithm(config=SFTConfig, evaluation=sft_eval)
def sft(batch, conversations, actor, cfg):
    batch = conversations.encode(batch)
    return actor.update(batch, loss=sft_loss.SFTLoss(cfg.loss_agg_mode))
