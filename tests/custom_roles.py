"""User-defined roles and the graphs that use them (a module, so Ray workers can import it)."""

import torch

import flowrl as fl
from flowrl import losses, stages
from flowrl.roles import decode_responses


@fl.role("judge", on_driver=True)
class Judge:
    """A second, rule-based reward: 1.0 for a response of exactly one character (eos not counted)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls = 0

    @classmethod
    def build(cls, ctx):
        return cls(ctx.tokenizer)

    @fl.graph_method(reads=("response_ids", "response_mask"), writes=("judge_scores",))
    def score(self, batch):
        self.calls += 1
        texts = decode_responses(self.tokenizer, batch)
        batch["judge_scores"] = torch.tensor([1.0 if len(t) == 1 else 0.0 for t in texts])
        fl.metrics.log("judge/mean", batch["judge_scores"].mean())
        return batch


@fl.stage(reads=("scores", "judge_scores"), writes=("scores",))
def add_judge(batch, weight: float = 0.5):
    batch["scores"] = batch["scores"] + weight * batch["judge_scores"]
    fl.metrics.log("combined/mean", batch["scores"].mean())
    return batch


@fl.algorithm
def grpo_judged(batch, actor, rollout, reward, judge):
    batch = rollout.generate(batch, n=4)
    batch = reward.score(batch)
    batch = judge.score(batch)
    batch = add_judge(batch)
    batch = actor.logprobs(batch)
    batch = stages.group_advantage(batch)
    return actor.update(batch, loss=losses.ppo_loss())


@fl.stage(reads=("scores", "rm_scores"), writes=("scores",))
def add_reward_model(batch, weight: float = 0.5):
    batch["scores"] = batch["scores"] + weight * batch["rm_scores"]
    fl.metrics.log("combined/mean", batch["scores"].mean())
    return batch


@fl.algorithm
def grpo_rule_and_rm(batch, actor, rollout, reward, reward_model):
    batch = rollout.generate(batch, n=4)
    batch = reward.score(batch)
    batch = reward_model.score(batch, key="rm_scores", metric="rm")
    batch = add_reward_model(batch)
    batch = actor.logprobs(batch)
    batch = stages.group_advantage(batch)
    return actor.update(batch, loss=losses.ppo_loss())
