"""On-policy distillation as a loss term: the student's samples, scored by a teacher role
(flowrl.roles.teacher writes "teacher_logprobs"), pull the student toward the teacher.

`DistillTerm(kind, policy_gradient)` is verl's distillation loss with a KL
estimator (ops.distillation.estimator_loss), or with forward top-k KL
(kind "forward_kl_topk" or "forward_kl_topk_renorm", ops.distillation.forward_kl_topk):
the teacher's top-k logprobs and ids (`teacher.logprobs(batch, topk=K)`)
against the student's logprobs at those ids, which the train engine gathers
chunk by chunk in the update's own forward pass (the model output
logprobs_at("teacher_topk_ids"), flowrl.engines.train.model_outputs); it also logs
verl's top-k masses, distill_teacher_mass and distill_student_mass. Supervised, the clamped
per-token estimate itself is the loss (verl's use_policy_gradient=False, as
arXiv:2306.13649); with policy_gradient, its negative (detached) is each
token's advantage in PPO's clipped loss against the old logprobs, with verl's
vanilla clips (0.2, dual clip 3), and the rollout correction's IS weights
multiply it (verl's default, after Thinking Machines' on-policy
distillation). Either way the term logs "distill_kl", the mean estimate:
the student's KL to the teacher on its own samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from tensordict import TensorDict

from flowrl.engines.train.model_outputs import logprobs_at
from flowrl.rl.loss_terms import TERMS, TermResult
from flowrl.rl.ops.distillation import (LOG_PROB_MIN_CLAMP, LOSS_MAX_CLAMP, TOPK_KINDS, check_kind, estimator_loss,
                                        forward_kl_topk, topk_mass)
from flowrl.rl.ops.masked import masked_mean
from flowrl.rl.ops.policy_loss import ppo_clip

VERL_CLIP, VERL_DUAL_CLIP = 0.2, 3.0  # verl's vanilla policy loss, its distillation policy_loss_mode
STUDENT_AT_TEACHER_TOPK = logprobs_at("teacher_topk_ids")  # the student's logprobs at the teacher's top-k ids


@TERMS.register("distill")
@dataclass(frozen=True)
class DistillTerm:
    """The distillation loss `kind` (verl's loss_mode: a KL estimator, or forward top-k KL), supervised or as a
    policy gradient; log_prob_min_clamp: the top-k kinds' floor of both logprobs (verl's)."""

    kind: str = "k1"
    policy_gradient: bool = True
    loss_max_clamp: float | None = LOSS_MAX_CLAMP
    log_prob_min_clamp: float | None = LOG_PROB_MIN_CLAMP
    metric: ClassVar[str] = "distill_loss"
    coef: ClassVar[float] = 1.0

    def __post_init__(self) -> None:
        check_kind(self.kind)
        if self.loss_max_clamp is not None and not self.loss_max_clamp > 0:
            raise ValueError(f"loss_max_clamp must be > 0 or None, got {self.loss_max_clamp}")

    @property
    def topk(self) -> bool:
        return self.kind in TOPK_KINDS

    @property
    def corrected(self) -> bool:
        return self.policy_gradient

    @property
    def needs(self) -> tuple[str, ...]:
        return ("logprobs",) + ((STUDENT_AT_TEACHER_TOPK,) if self.topk else ())

    @property
    def reads(self) -> tuple[str, ...]:
        teacher = ("teacher_topk_logprobs", "teacher_topk_ids") if self.topk else ("teacher_logprobs",)
        return teacher + ("loss_mask",) + (("old_logprobs",) if self.policy_gradient else ())

    def __call__(self, out: dict[str, torch.Tensor], mb: TensorDict,
                 is_weights_BT: torch.Tensor | None) -> TermResult:
        mask_BT = mb["loss_mask"]
        kl_BT, metrics = self._kl(out, mb)
        metrics["distill_kl"] = masked_mean(kl_BT.detach(), mask_BT)
        if not self.policy_gradient:
            return kl_BT, metrics
        loss_BT, pg_metrics = ppo_clip(out["logprobs"], mb["old_logprobs"], -kl_BT.detach(), mask_BT,
                                       VERL_CLIP, VERL_CLIP, VERL_DUAL_CLIP)
        if is_weights_BT is not None:
            loss_BT = loss_BT * is_weights_BT
        return loss_BT, {**pg_metrics, **metrics}

    def _kl(self, out: dict[str, torch.Tensor], mb: TensorDict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The per-token distillation loss, and the top-k masses of teacher and student (top-k kinds)."""
        mask_BT = mb["loss_mask"]
        if not self.topk:
            return estimator_loss(out["logprobs"], mb["teacher_logprobs"], mask_BT, self.kind,
                                  self.loss_max_clamp), {}
        student_BTK, teacher_BTK = out[STUDENT_AT_TEACHER_TOPK], mb["teacher_topk_logprobs"]
        kl_BT = forward_kl_topk(student_BTK, teacher_BTK, mask_BT, self.log_prob_min_clamp, self.loss_max_clamp,
                                renorm=self.kind == "forward_kl_topk_renorm")
        return kl_BT, {"distill_teacher_mass": masked_mean(topk_mass(teacher_BTK), mask_BT),
                       "distill_student_mass": masked_mean(topk_mass(student_BTK.detach()), mask_BT)}


__all__ = ["DistillTerm"]
