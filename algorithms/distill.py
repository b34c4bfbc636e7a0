"""On-policy distillation (verl's distillation trainer; Thinking Machines' on-policy distillation): the student
samples, a teacher model (`roles.teacher.model`) scores the student's tokens, and the student is pulled toward it
by a loss of verl's distillation registry, a KL estimator or forward top-k KL (the teacher's `topk` largest
logprobs at each token), supervised or as each token's negative advantage. No reward.
"""

import warnings
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

import flowrl as fl
from flowrl.rl.distillation import DistillTerm
from flowrl.rl.loss_terms import Loss
from flowrl.rl.ops.aggregate import AggMode
from flowrl.rl.ops.distillation import LOG_PROB_MIN_CLAMP, LOSS_MAX_CLAMP, TOPK_KINDS
from flowrl.rl.options import Sampled


class DistillConfig(Sampled):
    model_config = ConfigDict(extra="forbid")
    # the top-k kinds first: tests/test_algorithm_options traces with the first other choice, which reads topk
    kind: Literal["forward_kl_topk", "forward_kl_topk_renorm",
                  "k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"] = Field(
        "k1", description="The distillation loss (verl's loss_mode): a KL estimator of KL(student || teacher) per "
                          "sampled token (k1 is verl's advice with policy_gradient, k3 without), or forward top-k "
                          "KL(teacher || student) over the teacher's `topk` tokens (best without policy_gradient; "
                          "_renorm: both renormalised over them).")
    topk: int = Field(128, ge=1, description="The forward_kl_topk kinds: tokens of the teacher's distribution per "
                      "response token (verl's topk); the other kinds ignore it.")
    log_prob_min_clamp: float = Field(LOG_PROB_MIN_CLAMP, lt=0, description="The forward_kl_topk kinds: floor of "
                                      "both logprobs in the KL (verl's log_prob_min_clamp).")
    policy_gradient: bool = Field(True, description="Use -KL as each token's advantage in PPO's clipped loss "
                                  "(verl's use_policy_gradient); False: the KL estimate is the loss itself.")
    loss_max_clamp: float = Field(LOSS_MAX_CLAMP, gt=0, description="Clamp of the per-token KL estimate to "
                                  "[-loss_max_clamp, loss_max_clamp] (verl's loss_max_clamp).")
    loss_agg_mode: AggMode = Field("token-mean", description="How token losses are averaged (ops.aggregate).")
    n: int = Field(1, ge=1, description="Responses the student samples per prompt.")

    @model_validator(mode="after")
    def _k1_needs_the_policy_gradient(self) -> "DistillConfig":
        if not self.policy_gradient and self.kind in ("k1", "kl"):  # verl warns the same
            warnings.warn("algo.kind=k1 with policy_gradient=false: k1's gradient is grad logp, zero in "
                          "expectation on the student's samples; use k3", stacklevel=2)
        if self.policy_gradient and self.kind in TOPK_KINDS:  # verl warns the same
            warnings.warn(f"algo.kind={self.kind} with policy_gradient=true: the update moves only the sampled "
                          "token's logprob, so the teacher's top-k distribution is largely unused; set "
                          "policy_gradient=false", stacklevel=2)
        if "topk" in self.model_fields_set and self.kind not in TOPK_KINDS:
            warnings.warn(f"algo.topk has no effect with algo.kind={self.kind} (only the forward_kl_topk kinds "
                          "read the teacher's top-k)", stacklevel=2)
        return self


@fl.algorithm(config=DistillConfig)
def distill(batch, actor, rollout, teacher, cfg):
    batch = rollout.generate(batch, n=cfg.n)
    batch = teacher.logprobs(batch, topk=cfg.topk if cfg.kind in TOPK_KINDS else 0)
    if cfg.policy_gradient:
        batch = actor.logprobs(batch)
    term = DistillTerm(cfg.kind, cfg.policy_gradient, cfg.loss_max_clamp, cfg.log_prob_min_clamp)
    loss = Loss((term,), cfg.loss_agg_mode, rollout_correction=cfg.rollout_correction.build())
    return actor.update(batch, loss=loss)
