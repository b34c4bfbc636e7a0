"""DAPO: clip-higher, dynamic sampling of informative groups, token-mean loss, overlong shaping, no KL."""

from pydantic import ConfigDict, Field

import flowrl as fl
from flowrl.rl import losses, stages
from flowrl.rl.options import GroupSampling


class DAPOConfig(losses.ClipHigher, GroupSampling):
    model_config = ConfigDict(extra="forbid")
    dynamic_sampling: bool = Field(True, description="Drop groups whose scores are all equal and resample.")
    max_sampling_rounds: int = Field(4, ge=1, description="Generation rounds per step when filling groups.")
    max_response_len: int = Field(2, ge=1, description="Response cap the overlong penalty counts to "
                                                      "(filled from rollout.max_new_tokens).")
    overlong_buffer_len: int = Field(0, ge=0, description="Soft overlong punishment window; 0 is off.")
    overlong_penalty: float = Field(1.0, ge=0, description="Penalty at the hard cap.")


@fl.algorithm(config=DAPOConfig)
def dapo(batch, actor, rollout, reward, cfg):
    batch = rollout.generate(batch, n=cfg.group_size)
    batch = reward.score(batch)
    if cfg.overlong_buffer_len:
        batch = stages.overlong_penalty(batch, max_len=cfg.max_response_len, buffer_len=cfg.overlong_buffer_len,
                                        factor=cfg.overlong_penalty)
    if cfg.dynamic_sampling:
        batch = stages.drop_uniform_groups(batch)
        batch = fl.fill(batch, max_rounds=cfg.max_sampling_rounds)
    batch = actor.logprobs(batch)
    batch = stages.group_advantage(batch)
    return actor.update(batch, loss=cfg.loss())
