"""Per-token KL estimators between the policy and a reference policy, and the adaptive KL coefficient.

Schulman's estimators (http://joschu.net/blog/kl-approx.html) of
KL(pi || ref), evaluated on tokens sampled from pi, as in verl's kl_penalty.
Results are per token; padding is left to the caller's mask.
"""

from __future__ import annotations

import torch

BASE_KL_KINDS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
KL_KINDS = BASE_KL_KINDS + tuple(f"{kind}+" for kind in BASE_KL_KINDS)


def check_kl_kind(kind: str) -> None:
    """ValueError naming `kl_kind` unless `kind` is one of KL_KINDS."""
    if kind not in KL_KINDS:
        raise ValueError(f"kl_kind must be one of {KL_KINDS}, got {kind!r}")


def kl_penalty(logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of kind:

    - "k1" (alias "kl"): logp - ref.
    - "abs": |logp - ref|.
    - "k2" (alias "mse"): 0.5 * (logp - ref)^2.
    - "k3" (alias "low_var_kl"): r - log r - 1 with r = exp(ref - logp); the
      log-ratio is clamped to [-20, 20] and the result to [-10, 10] as in verl.
    - any of these with "+" ("k1+", "k3+", ...): verl's straight-through
      estimator, the value of the base kind with the gradient of k2,
      (logp - ref) * grad logp, whose expectation is the gradient of the KL
      (k1's and k3's are not). "k2+" is k2.
    """
    check_kl_kind(kind)
    forward_BT = _kl_forward(logprobs_BT, ref_logprobs_BT, kind.removesuffix("+"))
    if not kind.endswith("+"):
        return forward_BT
    backward_BT = 0.5 * (logprobs_BT - ref_logprobs_BT).square()
    return backward_BT - backward_BT.detach() + forward_BT.detach()


def _kl_forward(logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor, kind: str) -> torch.Tensor:
    log_ratio = logprobs_BT - ref_logprobs_BT
    if kind in ("k1", "kl"):
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind in ("k2", "mse"):
        return 0.5 * log_ratio.square()
    ref_minus_logp = torch.clamp(-log_ratio, min=-20.0, max=20.0)
    k3 = torch.exp(ref_minus_logp) - ref_minus_logp - 1
    return torch.clamp(k3, min=-10.0, max=10.0)


def adaptive_kl_coef(coef: float, current_kl: float, target_kl: float, horizon: int, num_steps: int) -> float:
    """One update of the adaptive KL controller (Ziegler et al., arXiv:1909.08593), verl's AdaptiveKLController.

    coef * (1 + clip(current_kl / target_kl - 1, -0.2, 0.2) * num_steps / horizon);
    verl counts `num_steps` as the batch's rows. coef .1, KL .15, target .1
    (error .5, clipped to .2), 4 rows, horizon 8 -> .1 * 1.1 = .11.
    """
    if target_kl <= 0:
        raise ValueError(f"target_kl must be > 0, got {target_kl}")
    if horizon <= 0:
        raise ValueError(f"horizon must be > 0, got {horizon}")
    error = min(max(current_kl / target_kl - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * num_steps / horizon)
