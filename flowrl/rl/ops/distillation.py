"""On-policy distillation losses, after verl's distillation registry (verl/trainer/distillation/losses.py).

The student samples; a teacher scores the student's tokens. Per token:

- the KL estimators ("k1"/"kl", "abs", "k2"/"mse", "k3"/"low_var_kl", ops.kl.kl_penalty) of
  KL(student || teacher) from the sampled token's logprobs under both, verl's
  compute_distillation_loss_reverse_kl_estimator;
- "forward_kl_topk": sum_k p_k (log p_k - log q_k) over the teacher's top-k
  tokens, p the teacher's and q the student's probabilities of those tokens,
  verl's compute_forward_kl_topk (its fsdp/losses.py), clamped at 0 below
  (the top-k masses do not sum to 1: the tail outside the top-k is left out);
- "forward_kl_topk_renorm": the same with p and q each renormalised to sum to 1
  over the teacher's top-k (verl's compute_forward_kl_topk_renorm, the GKD
  paper's top-k form).

Either is clamped to [-loss_max_clamp, loss_max_clamp] (verl's 10) and then
trained as a supervised loss, or its negative is the advantage of PPO's
clipped loss (verl's use_policy_gradient, the Thinking Machines recipe).
"""

from __future__ import annotations

import torch

from flowrl.rl.ops.kl import BASE_KL_KINDS, kl_penalty
from flowrl.rl.ops.masked import valid_mask

ESTIMATOR_KINDS = BASE_KL_KINDS  # k1 / kl, abs, k2 / mse, k3 / low_var_kl
TOPK_KINDS = ("forward_kl_topk", "forward_kl_topk_renorm")  # from the teacher's top-k logprobs
LOSS_MAX_CLAMP = 10.0  # verl's loss_max_clamp default
LOG_PROB_MIN_CLAMP = -10.0  # verl's log_prob_min_clamp default (top-k)


def check_kind(kind: str) -> None:
    """ValueError naming `kind` unless it is one of verl's distillation losses (an estimator or a top-k one)."""
    if kind not in ESTIMATOR_KINDS + TOPK_KINDS:
        raise ValueError(f"kind must be one of {ESTIMATOR_KINDS + TOPK_KINDS}, got {kind!r}")


def estimator_loss(logprobs_BT: torch.Tensor, teacher_logprobs_BT: torch.Tensor, mask_BT: torch.Tensor,
                   kind: str = "k3", loss_max_clamp: float | None = LOSS_MAX_CLAMP) -> torch.Tensor:
    """The per-token estimate of KL(student || teacher) on the student's sampled tokens, clamped to
    [-loss_max_clamp, loss_max_clamp] (None: not clamped), 0 on padding.

        logp [ln .5, ln .5], teacher [ln .25, ln 1]: k1 [ln 2, -ln 2] = [.693147, -.693147];
        k3 = r - ln r - 1, r = teacher / student = [.5, 2]: [.193147, .306853]
    """
    if kind not in ESTIMATOR_KINDS:
        raise ValueError(f"kind must be one of the KL estimators {ESTIMATOR_KINDS}, got {kind!r}")
    valid_BT = valid_mask(mask_BT, logprobs_BT)
    loss_BT = kl_penalty(torch.where(valid_BT, logprobs_BT, 0), torch.where(valid_BT, teacher_logprobs_BT, 0), kind)
    if loss_max_clamp is not None:
        loss_BT = loss_BT.clamp(min=-loss_max_clamp, max=loss_max_clamp)
    return torch.where(valid_BT, loss_BT, 0)


def forward_kl_topk(student_topk_logprobs_BTK: torch.Tensor, teacher_topk_logprobs_BTK: torch.Tensor,
                    mask_BT: torch.Tensor, log_prob_min_clamp: float | None = LOG_PROB_MIN_CLAMP,
                    loss_max_clamp: float | None = LOSS_MAX_CLAMP, renorm: bool = False) -> torch.Tensor:
    """sum_k p_k (log p_k - log q_k) over the teacher's top-k tokens, both logprobs clamped below at
    log_prob_min_clamp, the sum at 0 below and at loss_max_clamp above; 0 on padding. renorm: p and q
    first renormalised over the top-k, log p_k - logsumexp_j log p_j (verl's forward_kl_topk_renorm).

        teacher top-2 [ln .5, ln .25], student at those tokens [ln .25, ln .25]:
        .5 (ln .5 - ln .25) + .25 * 0 = .5 ln 2 = .346574
        renorm: p = [2/3, 1/3], q = [1/2, 1/2]: 2/3 ln(4/3) + 1/3 ln(2/3) = .191788 - .135155 = .056633
    """
    q_BTK, p_BTK = student_topk_logprobs_BTK.float(), teacher_topk_logprobs_BTK.float()
    if renorm:
        q_BTK = q_BTK - torch.logsumexp(q_BTK, dim=-1, keepdim=True)
        p_BTK = p_BTK - torch.logsumexp(p_BTK, dim=-1, keepdim=True)
    if log_prob_min_clamp is not None:
        q_BTK, p_BTK = q_BTK.clamp_min(log_prob_min_clamp), p_BTK.clamp_min(log_prob_min_clamp)
    loss_BT = (p_BTK.exp() * (p_BTK - q_BTK)).sum(-1).clamp_min(0.0)
    if loss_max_clamp is not None:
        loss_BT = loss_BT.clamp(max=loss_max_clamp)
    return torch.where(valid_mask(mask_BT, loss_BT), loss_BT, 0)


def topk_mass(topk_logprobs_BTK: torch.Tensor) -> torch.Tensor:
    """The probability the top-k holds at each token, sum_k exp(logprob_k) (verl's teacher_mass/student_mass)."""
    return topk_logprobs_BTK.float().exp().sum(-1)


__all__ = ["ESTIMATOR_KINDS", "LOG_PROB_MIN_CLAMP", "LOSS_MAX_CLAMP", "TOPK_KINDS", "check_kind", "estimator_loss",
           "forward_kl_topk", "topk_mass"]
