"""Policy objectives: per-token losses with importance ratios to the old policy.

Every objective has the signature
`(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, **clip) -> (loss_BT, metrics)`:
`loss_BT` is 0 on padding and is aggregated separately (ops.aggregate);
`metrics` are floats over valid tokens: "clipfrac" (fraction of tokens whose
ratio was clipped, or that a DPPO trust region masked out), "approx_kl" (mean
of old - new logprob, verl's ppo_kl) and "ratio_mean". Padding inputs are
replaced by 0 before use, so garbage there reaches neither the loss nor the
gradient.
"""

from __future__ import annotations

from functools import partial

import torch

from flowrl.rl.ops.masked import masked_mean, valid_mask

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


def clamped_log_ratio(logprobs_BT, old_logprobs_BT, valid_BT) -> torch.Tensor:
    diff_BT = torch.where(valid_BT, logprobs_BT - old_logprobs_BT, 0)
    return diff_BT.clamp(min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)


@torch.no_grad()
def ratio_metrics(log_ratio_BT, ratio_BT, clipped_BT, valid_BT) -> dict[str, torch.Tensor]:
    return {
        "clipfrac": masked_mean(clipped_BT.to(ratio_BT.dtype), valid_BT),
        "approx_kl": masked_mean(-log_ratio_BT, valid_BT),
        "ratio_mean": masked_mean(ratio_BT, valid_BT),
    }


def ppo_clip(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
             mask_BT: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
             dual_clip: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
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
    log_ratio_BT = clamped_log_ratio(logprobs_BT, old_logprobs_BT, valid_BT)
    ratio_BT = torch.exp(log_ratio_BT)
    loss1_BT = -adv_BT * ratio_BT
    loss2_BT = -adv_BT * torch.clamp(ratio_BT, 1 - clip_low, 1 + clip_high)
    loss_BT = torch.maximum(loss1_BT, loss2_BT)
    metrics = ratio_metrics(log_ratio_BT, ratio_BT, loss2_BT > loss1_BT, valid_BT)
    if dual_clip is not None:
        loss3_BT = -adv_BT * dual_clip
        capped_BT = (loss_BT > loss3_BT) & (adv_BT < 0)
        metrics["clipfrac_lower"] = masked_mean(capped_BT.to(ratio_BT.dtype), valid_BT).detach()
        loss_BT = torch.where(adv_BT < 0, torch.minimum(loss_BT, loss3_BT), loss_BT)
    return torch.where(valid_BT, loss_BT, 0), metrics


def gspo(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
         mask_BT: torch.Tensor, clip_low: float = 3e-4,
         clip_high: float = 4e-4) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
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
    metrics = ratio_metrics(log_ratio_BT, s_BT, loss2_BT > loss1_BT, valid_BT)
    return torch.where(valid_BT, loss_BT, 0), metrics


def cispo(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
          mask_BT: torch.Tensor, clip_low: float = 10.0,
          clip_high: float = 0.2) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
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
    log_ratio_BT = clamped_log_ratio(logprobs_BT, old_logprobs_BT, valid_BT)
    ratio_BT = torch.exp(log_ratio_BT)
    weight_BT = torch.clamp(ratio_BT, 1 - clip_low, 1 + clip_high).detach()
    loss_BT = -weight_BT * adv_BT * logp_BT
    metrics = ratio_metrics(log_ratio_BT, ratio_BT, weight_BT != ratio_BT, valid_BT)
    return torch.where(valid_BT, loss_BT, 0), metrics


def check_ratio_cap(ratio_cap: float) -> None:
    """ValueError naming ratio_cap when it is below 1 (it would shrink on-policy weights)."""
    if not ratio_cap >= 1.0:
        raise ValueError(f"ratio_cap must be >= 1 (e.g. 20.0), got {ratio_cap}")


def binary_kl(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor) -> torch.Tensor:
    """KL(Bernoulli(q) || Bernoulli(p)) of the sampled token, p = exp(logp), q = exp(old).

    d = q (log q - log p) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8)), verl's
    dppo_kl; the logs are taken from the inputs, so q = 0 gives 0, not NaN, and
    1e-8 keeps p = 1 or q = 1 finite. q = .5, p = .25: .5 ln 2 + .5 ln(2/3) = .143841.
    """
    p_BT, q_BT = logprobs_BT.exp(), old_logprobs_BT.exp()
    return q_BT * (old_logprobs_BT - logprobs_BT) + (1 - q_BT) * torch.log((1 - q_BT + 1e-8) / (1 - p_BT + 1e-8))


def _tv_keep(logp_BT, old_BT, adv_BT, clip_low: float, clip_high: float) -> torch.Tensor:
    diff_BT = logp_BT.exp() - old_BT.exp()
    return torch.where(adv_BT > 0, diff_BT <= clip_high, diff_BT >= -clip_low)


def _binary_kl_keep(logp_BT, old_BT, adv_BT, clip_low: float, clip_high: float) -> torch.Tensor:
    d_BT = binary_kl(logp_BT, old_BT)
    return torch.where(adv_BT > 0, (d_BT <= clip_high) | (logp_BT <= old_BT), (d_BT <= clip_low) | (logp_BT >= old_BT))


def _trust_region_pg(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, keep_fn,
                     ratio_cap: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-A * sg(min(r, ratio_cap)) * logp on tokens keep_fn(logp, old, A) keeps (no grad), 0 elsewhere.

    keep_fn sees logp, old and A with padding set to 0. "clipfrac" is the
    fraction of valid tokens masked out, "truncfrac" the fraction kept with r
    above ratio_cap (verl's pg_clipfrac_lower for DPPO).
    """
    valid_BT = valid_mask(mask_BT, logprobs_BT)
    adv_BT = torch.where(valid_BT, advantages_BT, 0)
    logp_BT = torch.where(valid_BT, logprobs_BT, 0)
    old_BT = torch.where(valid_BT, old_logprobs_BT, 0)
    log_ratio_BT = clamped_log_ratio(logprobs_BT, old_logprobs_BT, valid_BT)
    ratio_BT = torch.exp(log_ratio_BT)
    with torch.no_grad():
        keep_BT = keep_fn(logp_BT, old_BT, adv_BT) & valid_BT
        weight_BT = ratio_BT.clamp(max=ratio_cap)
    loss_BT = torch.where(keep_BT, -adv_BT * weight_BT * logp_BT, 0)
    metrics = ratio_metrics(log_ratio_BT, ratio_BT, ~keep_BT, valid_BT)
    metrics["truncfrac"] = masked_mean((keep_BT & (ratio_BT > ratio_cap)).to(ratio_BT.dtype), valid_BT).detach()
    return loss_BT, metrics


def dppo_tv(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
            mask_BT: torch.Tensor, clip_low: float = 0.15, clip_high: float = 0.15,
            ratio_cap: float = 20.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPPO-Binary-TV (arXiv:2602.04879), verl's "dppo_tv" loss mode.

    A trust region on the sampled token's probability, not its ratio: with
    p = exp(logp), q = exp(old), a token with A > 0 is masked out once
    p - q > clip_high, one with A <= 0 once p - q < -clip_low. Kept tokens get
    the truncated-IS policy gradient -A * sg(min(r, ratio_cap)) * logp.
    """
    check_clip_args(clip_low, clip_high)
    check_ratio_cap(ratio_cap)
    keep_fn = partial(_tv_keep, clip_low=clip_low, clip_high=clip_high)
    return _trust_region_pg(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, keep_fn, ratio_cap)


def dppo_kl(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
            mask_BT: torch.Tensor, clip_low: float = 0.15, clip_high: float = 0.15,
            ratio_cap: float = 20.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPPO-Binary-KL (arXiv:2602.04879), verl's "dppo_kl" loss mode.

    dppo_tv with d = binary_kl(logp, old) as the divergence: a token with
    A > 0 is masked out when d > clip_high and p > q (it moved up, out of the
    region), one with A <= 0 when d > clip_low and p < q. verl's example runs
    it with thresholds 0.05.
    """
    check_clip_args(clip_low, clip_high)
    check_ratio_cap(ratio_cap)
    keep_fn = partial(_binary_kl_keep, clip_low=clip_low, clip_high=clip_high)
    return _trust_region_pg(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, keep_fn, ratio_cap)
