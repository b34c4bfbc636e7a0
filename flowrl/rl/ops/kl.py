"""Per-token KL estimators between the policy and a reference policy.

Schulman's estimators (http://joschu.net/blog/kl-approx.html) of
KL(pi || ref), evaluated on tokens sampled from pi, as in verl's kl_penalty.
Results are per token; padding is left to the caller's mask.
"""

from __future__ import annotations

import torch

KL_KINDS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")


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
    """
    check_kl_kind(kind)
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
