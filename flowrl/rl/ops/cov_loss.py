"""Clip-Cov and KL-Cov (arXiv:2505.22617, "The Entropy Mechanism of RL for Reasoning LMs").

Both single out the few tokens whose centred advantage times centred logprob
(their covariance term) is largest, the ones that drive entropy collapse:
Clip-Cov takes their gradient away, KL-Cov adds a KL penalty to them. The
statistics are over the valid tokens of the micro-batch the objective sees,
as in verl. Same signature and metrics as flowrl.rl.ops.policy_loss.
"""

from __future__ import annotations

import torch

from flowrl.rl.ops.masked import masked_mean, valid_mask
from flowrl.rl.ops.policy_loss import clamped_log_ratio, ratio_metrics, check_clip_args


def token_covariance(advantages_BT: torch.Tensor, logprobs_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """(A - mean A) * (logp - mean logp) per token, means over valid tokens; detached, 0 on padding.

        A [1, -1, 0], logp [-1, -3, -2]: means 0, -2 -> [1 * 1, -1 * -1, 0] = [1, 1, 0]
    """
    valid_BT = valid_mask(mask_BT, logprobs_BT)
    adv_BT = torch.where(valid_BT, advantages_BT, 0).detach()
    logp_BT = torch.where(valid_BT, logprobs_BT, 0).detach()
    cov_BT = (adv_BT - masked_mean(adv_BT, valid_BT)) * (logp_BT - masked_mean(logp_BT, valid_BT))
    return torch.where(valid_BT, cov_BT, 0)


def _num_picked(ratio: float, valid_BT: torch.Tensor) -> int:
    return max(int(ratio * int(valid_BT.sum())), 1)


def clip_cov(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
             mask_BT: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2, cov_ratio: float = 2e-4,
             cov_lb: float = 1.0, cov_ub: float = 5.0,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov, verl's "clip_cov" loss mode: PPO's clipped loss, with a few high-covariance tokens detached.

    Among valid tokens PPO's clip left alone whose covariance lies in (cov_lb,
    cov_ub), max(1, int(cov_ratio * valid tokens)) are drawn at random (from
    `generator`) and get loss 0. Defaults are verl's. Metrics add
    "cov_clipfrac", the fraction of valid tokens so dropped (verl's pg_clipfrac).
    """
    check_clip_args(clip_low, clip_high)
    if not cov_ratio > 0:
        raise ValueError(f"cov_ratio must be > 0, got {cov_ratio}")
    valid_BT = valid_mask(mask_BT, logprobs_BT)
    adv_BT = torch.where(valid_BT, advantages_BT, 0)
    log_ratio_BT = clamped_log_ratio(logprobs_BT, old_logprobs_BT, valid_BT)
    ratio_BT = torch.exp(log_ratio_BT)
    loss1_BT = -adv_BT * ratio_BT
    loss2_BT = -adv_BT * torch.clamp(ratio_BT, 1 - clip_low, 1 + clip_high)
    clipped_BT = (loss2_BT > loss1_BT) & valid_BT
    cov_BT = token_covariance(advantages_BT, logprobs_BT, mask_BT)
    candidates_BT = (cov_BT > cov_lb) & (cov_BT < cov_ub) & valid_BT & ~clipped_BT
    candidates_N = candidates_BT.reshape(-1).nonzero().squeeze(-1)
    dropped_N = torch.zeros(candidates_BT.numel(), dtype=torch.bool, device=candidates_BT.device)
    if candidates_N.numel():
        order = torch.randperm(candidates_N.numel(), generator=generator).to(candidates_N.device)
        dropped_N[candidates_N[order[:_num_picked(cov_ratio, valid_BT)]]] = True
    keep_BT = ~dropped_N.reshape(candidates_BT.shape)
    loss_BT = torch.where(valid_BT & keep_BT, torch.maximum(loss1_BT, loss2_BT), 0)
    metrics = ratio_metrics(log_ratio_BT, ratio_BT, clipped_BT, valid_BT)
    metrics["cov_clipfrac"] = masked_mean((~keep_BT).to(ratio_BT.dtype), valid_BT).detach()
    return loss_BT, metrics


def kl_cov(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
           mask_BT: torch.Tensor, kl_cov_ratio: float = 2e-4,
           kl_coef: float = 0.1) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov, verl's "kl_cov" loss mode: the unclipped surrogate -A * r, plus kl_coef * |log r| on the
    max(1, int(kl_cov_ratio * valid tokens)) tokens of largest covariance (torch.topk, as verl).

    No ratio clip anywhere. kl_coef is verl's ppo_kl_coef (0.1). Metrics add
    "cov_klfrac", the fraction of valid tokens penalised.
    """
    if not kl_cov_ratio > 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    valid_BT = valid_mask(mask_BT, logprobs_BT)
    adv_BT = torch.where(valid_BT, advantages_BT, 0)
    log_ratio_BT = clamped_log_ratio(logprobs_BT, old_logprobs_BT, valid_BT)
    ratio_BT = torch.exp(log_ratio_BT)
    loss_BT = -adv_BT * ratio_BT
    flat_valid = valid_BT.reshape(-1).nonzero().squeeze(-1)
    penalised_N = torch.zeros(valid_BT.numel(), dtype=torch.bool, device=valid_BT.device)
    if flat_valid.numel():
        cov_N = token_covariance(advantages_BT, logprobs_BT, mask_BT).reshape(-1)[flat_valid]
        penalised_N[flat_valid[torch.topk(cov_N, _num_picked(kl_cov_ratio, valid_BT)).indices]] = True
    penalised_BT = penalised_N.reshape(valid_BT.shape)
    loss_BT = torch.where(penalised_BT, loss_BT + kl_coef * log_ratio_BT.abs(), loss_BT)
    metrics = ratio_metrics(log_ratio_BT, ratio_BT, torch.zeros_like(valid_BT), valid_BT)
    metrics["cov_klfrac"] = masked_mean(penalised_BT.to(ratio_BT.dtype), valid_BT).detach()
    return torch.where(valid_BT, loss_BT, 0), metrics
