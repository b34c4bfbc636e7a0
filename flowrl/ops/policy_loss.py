"""Policy objectives: per-token losses with importance ratios to the old policy.

Every objective has the signature
`(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, **clip) -> (loss_BT, metrics)`:
`loss_BT` is 0 on padding and is aggregated separately (ops.aggregate);
`metrics` are floats over valid tokens: "clipfrac" (fraction of tokens whose
ratio was clipped), "approx_kl" (mean of old - new logprob, verl's ppo_kl)
and "ratio_mean". Padding inputs are replaced by 0 before use, so garbage
there reaches neither the loss nor the gradient.
"""

from __future__ import annotations

import torch

from flowrl.ops.masked import masked_mean, valid_mask

LOG_RATIO_CLAMP = 20.0  # |log(pi / pi_old)| is clamped here before exp, as in verl
GSPO_LOG_RATIO_MAX = 10.0  # verl's upper clamp of GSPO's log sequence ratio


def check_clip_args(clip_low: float, clip_high: float, dual_clip: float | None = None) -> None:
    """ValueError naming the argument for a negative clip or a dual clip <= 1."""
    if clip_low < 0:
        raise ValueError(f"clip_low must be >= 0, got {clip_low}")
    if clip_high < 0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (e.g. 3.0) or None, got {dual_clip}")


def _log_ratio(logprobs_BT, old_logprobs_BT, valid_BT) -> torch.Tensor:
    diff_BT = torch.where(valid_BT, logprobs_BT - old_logprobs_BT, 0)
    return diff_BT.clamp(min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)


@torch.no_grad()
def _ratio_metrics(log_ratio_BT, ratio_BT, clipped_BT, valid_BT) -> dict[str, float]:
    return {
        "clipfrac": float(masked_mean(clipped_BT.to(ratio_BT.dtype), valid_BT)),
        "approx_kl": float(masked_mean(-log_ratio_BT, valid_BT)),
        "ratio_mean": float(masked_mean(ratio_BT, valid_BT)),
    }


def ppo_clip(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
             mask_BT: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
             dual_clip: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate, verl's compute_policy_loss_vanilla.

    loss = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high)) with
    r = exp(logp - old) (log-ratio clamped to [-20, 20]). clip_high > clip_low
    is DAPO's clip-higher. Dual clip c (> 1, arXiv:1912.09729) caps the loss of
    negative advantages at -A * c: loss = min(that, -A * c) where A < 0; it
    adds the metric "clipfrac_lower" (tokens where the cap bit).
    """
    check_clip_args(clip_low, clip_high, dual_clip)
    valid_BT = valid_mask(mask_BT, logprobs_BT)
    adv_BT = torch.where(valid_BT, advantages_BT, 0)
    log_ratio_BT = _log_ratio(logprobs_BT, old_logprobs_BT, valid_BT)
    ratio_BT = torch.exp(log_ratio_BT)
    loss1_BT = -adv_BT * ratio_BT
    loss2_BT = -adv_BT * torch.clamp(ratio_BT, 1 - clip_low, 1 + clip_high)
    loss_BT = torch.maximum(loss1_BT, loss2_BT)
    metrics = _ratio_metrics(log_ratio_BT, ratio_BT, loss2_BT > loss1_BT, valid_BT)
    if dual_clip is not None:
        loss3_BT = -adv_BT * dual_clip
        capped_BT = (loss_BT > loss3_BT) & (adv_BT < 0)
        metrics["clipfrac_lower"] = float(masked_mean(capped_BT.to(ratio_BT.dtype), valid_BT))
        loss_BT = torch.where(adv_BT < 0, torch.minimum(loss_BT, loss3_BT), loss_BT)
    return torch.where(valid_BT, loss_BT, 0), metrics


def gspo(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
         mask_BT: torch.Tensor, clip_low: float = 3e-4,
         clip_high: float = 4e-4) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (arXiv:2507.18071): PPO clipping on the sequence-level ratio.

    s_i = exp(mean_t(logp - old)) over row i's valid tokens. Per token,
    log s_i,t = sg[log s_i] + logp_t - sg[logp_t] (clamped above at 10, as
    verl): its value is s_i and its gradient is the sequence ratio's, so with
    "seq-mean-token-mean" aggregation and sequence-level advantages this is
    the paper's objective. Defaults are the paper's clip range. "ratio_mean"
    is the mean of s_i over valid tokens.
    """
    check_clip_args(clip_low, clip_high)
    valid_BT = valid_mask(mask_BT, logprobs_BT)
    adv_BT = torch.where(valid_BT, advantages_BT, 0)
    logp_BT = torch.where(valid_BT, logprobs_BT, 0)
    log_ratio_BT = torch.where(valid_BT, logprobs_BT - old_logprobs_BT, 0)
    seq_log_ratio_B = masked_mean(log_ratio_BT, valid_BT, dim=-1)
    log_s_BT = seq_log_ratio_B.detach().unsqueeze(-1) + logp_BT - logp_BT.detach()
    s_BT = torch.exp(log_s_BT.clamp(max=GSPO_LOG_RATIO_MAX))
    loss1_BT = -adv_BT * s_BT
    loss2_BT = -adv_BT * torch.clamp(s_BT, 1 - clip_low, 1 + clip_high)
    loss_BT = torch.maximum(loss1_BT, loss2_BT)
    metrics = _ratio_metrics(log_ratio_BT, s_BT, loss2_BT > loss1_BT, valid_BT)
    return torch.where(valid_BT, loss_BT, 0), metrics


def cispo(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
          mask_BT: torch.Tensor, clip_low: float = 10.0,
          clip_high: float = 0.2) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, arXiv:2506.13585), verl's "cispo" loss mode.

    loss = -sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * logp: the ratio is
    clipped as a detached weight, so every token keeps a gradient through
    logp, clipped or not. Defaults are verl's CISPO example: clip_low=10 (no
    lower bound, as the paper sets eps_low large) and clip_high=0.2.
    """
    check_clip_args(clip_low, clip_high)
    valid_BT = valid_mask(mask_BT, logprobs_BT)
    adv_BT = torch.where(valid_BT, advantages_BT, 0)
    logp_BT = torch.where(valid_BT, logprobs_BT, 0)
    log_ratio_BT = _log_ratio(logprobs_BT, old_logprobs_BT, valid_BT)
    ratio_BT = torch.exp(log_ratio_BT)
    weight_BT = torch.clamp(ratio_BT, 1 - clip_low, 1 + clip_high).detach()
    loss_BT = -weight_BT * adv_BT * logp_BT
    metrics = _ratio_metrics(log_ratio_BT, ratio_BT, weight_BT != ratio_BT, valid_BT)
    return torch.where(valid_BT, loss_BT, 0), metrics


def entropy_from_logits(logits_BTV: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position: logsumexp - sum(softmax * logits)."""
    probs_BTV = torch.softmax(logits_BTV, dim=-1)
    return torch.logsumexp(logits_BTV, dim=-1) - (probs_BTV * logits_BTV).sum(dim=-1)
