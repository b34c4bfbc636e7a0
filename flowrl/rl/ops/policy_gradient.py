"""Policy objectives without PPO's ratio clip: REINFORCE / GPG, SAPO's soft gate, GMPO's geometric mean, DRO.

Same signature and conventions as flowrl.rl.ops.policy_loss:
`(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, **options) -> (loss_BT, metrics)`,
`loss_BT` 0 on padding, padding inputs replaced by 0 before use, metrics
"clipfrac", "approx_kl" (mean old - new logprob) and "ratio_mean" over valid tokens.
"""

from __future__ import annotations

import torch

from flowrl.rl.ops.masked import masked_mean, valid_mask
from flowrl.rl.ops.policy_loss import clamped_log_ratio, ratio_metrics, check_clip_args

IS_LOG_EPS = 1e-10  # verl's geo_mean: log(w + 1e-10) before the weights' geometric mean


def _inputs(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT):
    """(valid, advantages, logprobs, log-ratio clamped to [-20, 20]), padding set to 0."""
    valid_BT = valid_mask(mask_BT, logprobs_BT)
    adv_BT = torch.where(valid_BT, advantages_BT, 0)
    logp_BT = torch.where(valid_BT, logprobs_BT, 0)
    return valid_BT, adv_BT, logp_BT, clamped_log_ratio(logprobs_BT, old_logprobs_BT, valid_BT)


def reinforce(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
              mask_BT: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Plain REINFORCE, verl's compute_policy_loss_reinforce: loss = -A * logp.

    No ratio and no clip; the old logprobs only feed the metrics. Its gradient
    is -A * grad logp on every token, on- or off-policy. logp [-1, -2, -.5],
    A [1, -1, 2] -> [1, -2, 1].
    """
    valid_BT, adv_BT, logp_BT, log_ratio_BT = _inputs(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT)
    loss_BT = torch.where(valid_BT, -adv_BT * logp_BT, 0)
    ratio_BT = log_ratio_BT.detach().exp()
    return loss_BT, ratio_metrics(log_ratio_BT, ratio_BT, torch.zeros_like(valid_BT), valid_BT)


def gpg(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
        mask_BT: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GPG's loss (arXiv:2504.02546), verl's "gpg" loss mode: -A * logp, the same as `reinforce`."""
    return reinforce(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT)


def sapo(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
         mask_BT: torch.Tensor, tau_pos: float = 1.0,
         tau_neg: float = 1.05) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO (arXiv:2511.20347), verl's "sapo" loss mode: a smooth gate instead of a hard clip.

    loss = -f(r, tau) * A with f(r, tau) = sigmoid(tau * (r - 1)) * 4 / tau,
    tau = tau_pos where A > 0 and tau_neg elsewhere. f'(1) = 1, so on-policy
    the gradient is the policy gradient; far from r = 1 it fades smoothly.
    r = 1, A = 1, tau 1 -> loss -2. Nothing is clipped: "clipfrac" is 0.
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"tau_pos and tau_neg must be > 0, got {tau_pos} and {tau_neg}")
    valid_BT, adv_BT, _, log_ratio_BT = _inputs(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT)
    ratio_BT = torch.exp(log_ratio_BT)
    tau_BT = torch.where(adv_BT > 0, tau_pos, tau_neg).to(ratio_BT.dtype)
    gate_BT = torch.sigmoid(tau_BT * (ratio_BT - 1.0)) * (4.0 / tau_BT)
    loss_BT = torch.where(valid_BT, -gate_BT * adv_BT, 0)
    return loss_BT, ratio_metrics(log_ratio_BT, ratio_BT, torch.zeros_like(valid_BT), valid_BT)


def gmpo(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
         mask_BT: torch.Tensor, clip_low: float = 0.4, clip_high: float = 0.4,
         is_weights_BT: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GMPO (arXiv:2507.20673), verl's "geo_mean" loss mode: the geometric mean of token ratios.

    Each token's log-ratio is clipped to [-clip_low, clip_high] in the
    direction its advantage pushes (sign(A) * min(sign(A) * l, sign(A) *
    clip(l))); a row's loss is -mean_t(A) * exp(mean_t(clipped l)), put on
    each of its valid tokens, so "seq-mean-token-mean" aggregation gives
    verl's mean over rows. Advantages should be per sequence, as verl assumes.
    Rollout IS weights w_t (detached) join the geometric mean, as in verl:
    the row loss is times exp(mean_t log(w_t + 1e-10)), not mean_t w_t.
    Defaults are verl's GMPO example (clip range e^-0.4 .. e^0.4). "clipfrac"
    counts clipped tokens with A > 0, "clipfrac_lower" those with A < 0;
    "ratio_mean" is the mean row ratio over valid tokens.
    """
    check_clip_args(clip_low, clip_high)
    valid_BT, adv_BT, _, log_ratio_BT = _inputs(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT)
    sign_BT = torch.sign(adv_BT)
    clamped_BT = log_ratio_BT.clamp(min=-clip_low, max=clip_high)
    clipped_log_BT = sign_BT * torch.minimum(sign_BT * log_ratio_BT, sign_BT * clamped_BT)
    seq_ratio_B = torch.exp(masked_mean(clipped_log_BT, valid_BT, dim=-1))
    seq_adv_B = masked_mean(adv_BT, valid_BT, dim=-1)
    row_loss_B = -seq_adv_B * seq_ratio_B
    if is_weights_BT is not None:
        log_w_BT = torch.log(torch.where(valid_BT, is_weights_BT.detach(), 1) + IS_LOG_EPS)
        row_loss_B = row_loss_B * torch.exp(masked_mean(log_w_BT, valid_BT, dim=-1))
    loss_BT = torch.where(valid_BT, row_loss_B.unsqueeze(-1), 0)
    clipped_BT = log_ratio_BT != clamped_BT
    metrics = ratio_metrics(log_ratio_BT, seq_ratio_B.detach().unsqueeze(-1).expand_as(log_ratio_BT),
                            clipped_BT & (adv_BT > 0), valid_BT)
    metrics["clipfrac_lower"] = masked_mean((clipped_BT & (adv_BT < 0)).to(loss_BT.dtype), valid_BT).detach()
    return loss_BT, metrics


def dro(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor, advantages_BT: torch.Tensor,
        mask_BT: torch.Tensor, beta: float = 0.1) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Direct Reward Optimization, verl's "dro" loss mode: -(A * logp - beta / 2 * (logp - old)^2).

    The policy gradient with a quadratic penalty on the log ratio in place of
    a clip (its gradient pulls logp back to old in proportion to the
    distance). beta is verl's dro_beta (required there, no default; 0.1
    here). The log ratio is not clamped, as verl. logp [-1, -2, -.5], old
    [-1, -1, -1], A [1, -1, 2], beta .5 -> [1, -2 + .25, 1 + .0625] =
    [1, -1.75, 1.0625].
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0 (verl's dro_beta), got {beta}")
    valid_BT, adv_BT, logp_BT, log_ratio_BT = _inputs(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT)
    raw_log_ratio_BT = torch.where(valid_BT, logprobs_BT - old_logprobs_BT, 0)
    loss_BT = -(adv_BT * logp_BT - 0.5 * beta * raw_log_ratio_BT.square())
    ratio_BT = log_ratio_BT.detach().exp()
    return torch.where(valid_BT, loss_BT, 0), ratio_metrics(log_ratio_BT, ratio_BT, torch.zeros_like(valid_BT),
                                                            valid_BT)
