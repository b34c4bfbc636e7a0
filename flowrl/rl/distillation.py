"""On-policy distillation as a loss term: the student's samples, scored by a teacher role
(flowrl.roles.teacher writes "teacher_logprobs"), pull the student toward the teacher.

`DistillTerm(kind, policy_gradient)` is verl's distillation loss with a KL
estimator (ops.distillation.estimator_loss): supervised, the clamped
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

from flowrl.rl.loss_terms import TERMS, TermResult
from flowrl.rl.ops.distillation import LOSS_MAX_CLAMP, check_estimator_kind, estimator_loss
from flowrl.rl.ops.masked import masked_mean
from flowrl.rl.ops.policy_loss import ppo_clip

VERL_CLIP, VERL_DUAL_CLIP = 0.2, 3.0  # verl's vanilla policy loss, its distillation policy_loss_mode


@TERMS.register("distill")
@dataclass(frozen=True)
class DistillTerm:
    """The distillation loss of one KL estimator `kind` (verl's loss_mode), supervised or as a policy gradient."""

    kind: str = "k1"
    policy_gradient: bool = True
    loss_max_clamp: float | None = LOSS_MAX_CLAMP
    metric: ClassVar[str] = "distill_loss"
    coef: ClassVar[float] = 1.0
    needs: ClassVar[tuple[str, ...]] = ("logprobs",)

    def __post_init__(self) -> None:
        check_estimator_kind(self.kind)
        if self.loss_max_clamp is not None and not self.loss_max_clamp > 0:
            raise ValueError(f"loss_max_clamp must be > 0 or None, got {self.loss_max_clamp}")

    @property
    def corrected(self) -> bool:
        return self.policy_gradient

    @property
    def reads(self) -> tuple[str, ...]:
        return ("teacher_logprobs", "loss_mask") + (("old_logprobs",) if self.policy_gradient else ())

    def __call__(self, out: dict[str, torch.Tensor], mb: TensorDict,
                 is_weights_BT: torch.Tensor | None) -> TermResult:
        mask_BT = mb["loss_mask"]
        kl_BT = estimator_loss(out["logprobs"], mb["teacher_logprobs"], mask_BT, self.kind, self.loss_max_clamp)
        metrics = {"distill_kl": masked_mean(kl_BT.detach(), mask_BT)}
        if not self.policy_gradient:
            return kl_BT, metrics
        loss_BT, pg_metrics = ppo_clip(out["logprobs"], mb["old_logprobs"], -kl_BT.detach(), mask_BT,
                                       VERL_CLIP, VERL_CLIP, VERL_DUAL_CLIP)
        if is_weights_BT is not None:
            loss_BT = loss_BT * is_weights_BT
        return loss_BT, {**pg_metrics, **metrics}


__all__ = ["DistillTerm"]
