"""Rollout correction: the sampler's and the trainer's logprobs disagree (kernels, precision).

After verl's decoupled rollout correction (verl/trainer/ppo/rollout_corr_helper.py:
compute_rollout_correction_weights, compute_rollout_rejection_mask,
compute_offpolicy_metrics). Everything is a function of the per-token log ratio
log rho_t = old_t - rollout_t, where old is the trainer's logprob of the sampled
token (pi_old) and rollout the sampler's (pi_rollout); rho = pi_old / pi_rollout.

Levels (a per-token log ratio, broadcast to every token of its row):
- "token": log rho_t.
- "sequence": sum_t log rho_t, the log of the sequence ratio prod_t rho_t.
- "geometric": mean_t log rho_t, the log of the geometric mean of the rho_t.

verl's IS weights take "token" and "sequence"; its ratio-bound rejection
sampling took all three (rollout_rs="token"/"sequence"/"geometric", now
"token_k1"/"seq_sum_k1"/"seq_mean_k1"); geometric IS weights are from verl's
earlier mismatch_helper.py (rollout_is_level="geometric"). The log ratio is
clamped to [-20, 20] before exp, as verl's SAFETY_BOUND. Padding inputs are
replaced by 0 first, so garbage there reaches no result.

Rejection by a divergence (verl's "token_k2", "seq_sum_k3", "seq_max_k2", ...):
the per-token k2 = (log rho)^2 / 2 or k3 = rho - 1 - log rho, taken per token
or reduced over the row by sum ("sequence"), mean ("geometric") or "max", is
bounded above. IS weights may be IcePop's (0 outside [lower, upper] instead of
truncated) and normalised to mean 1 (verl's rollout_is_batch_normalize).
"""

from __future__ import annotations

import torch

from flowrl.rl.ops.masked import masked_mean, masked_sum, valid_mask

LEVELS = ("token", "sequence", "geometric")
RS_LEVELS = LEVELS + ("max",)  # "max" only for the k2 / k3 divergences, as verl's seq_max_k2 / seq_max_k3
ESTIMATORS = ("k1", "k2", "k3")  # k1: the ratio's bounds; k2, k3: an upper bound on the divergence
SAFETY_BOUND = 20.0  # verl's clamp of log ratios before exp: exp(20) ~ 4.9e8
NORM_EPS = 1e-8  # batch normalisation is skipped when the mean weight is not above this, as verl


def check_level(level: str, name: str = "level", levels: tuple[str, ...] = LEVELS) -> None:
    """ValueError naming `name` unless `level` is one of `levels`."""
    if level not in levels:
        raise ValueError(f"{name} must be one of {levels}, got {level!r}")


def check_estimator(estimator: str, level: str, name: str = "estimator") -> None:
    """ValueError naming `name` unless it is one of ESTIMATORS, and "k1" is not asked for at level "max"."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"{name} must be one of {ESTIMATORS}, got {estimator!r}")
    if estimator == "k1" and level == "max":
        raise ValueError(f"{name}: level 'max' takes 'k2' or 'k3' (verl has no seq_max_k1), got 'k1'")


def log_ratio(old_logprobs_BT: torch.Tensor, rollout_logprobs_BT: torch.Tensor,
              mask_BT: torch.Tensor) -> torch.Tensor:
    """log rho = old - rollout on valid tokens, 0 on padding.

        old [-1, -2, 9], rollout [-1.5, -1, nan], mask [1, 1, 0] -> [.5, -1, 0]
    """
    valid_BT = valid_mask(mask_BT, old_logprobs_BT)
    return torch.where(valid_BT, old_logprobs_BT - rollout_logprobs_BT, 0)


def level_log_ratio(log_ratio_BT: torch.Tensor, mask_BT: torch.Tensor, level: str) -> torch.Tensor:
    """The log ratio (or any per-token statistic) at `level` on every valid token of its row, 0 on padding.

        log rho [[.5, -1, 0]], mask [[1, 1, 0]]: token [.5, -1, 0];
        sequence .5 - 1 = -.5 -> [-.5, -.5, 0]; geometric -.5 / 2 -> [-.25, -.25, 0]; max [.5, .5, 0]
    """
    check_level(level, "level", RS_LEVELS)
    valid_BT = valid_mask(mask_BT, log_ratio_BT)
    if level == "token":
        return torch.where(valid_BT, log_ratio_BT, 0)
    if level == "max":
        row_B = torch.where(valid_BT, log_ratio_BT, -torch.inf).amax(-1)
        row_B = torch.where(row_B == -torch.inf, 0, row_B)  # verl: 0 for a row without valid tokens
    else:
        reduce = masked_sum if level == "sequence" else masked_mean
        row_B = reduce(log_ratio_BT, mask_BT, dim=-1).to(log_ratio_BT.dtype)
    return torch.where(valid_BT, row_B.unsqueeze(-1), 0)


def token_divergence(log_ratio_BT: torch.Tensor, estimator: str) -> torch.Tensor:
    """verl's per-token rejection statistics of l = log rho clamped to [-20, 20]: k1 = -l,
    k2 = l^2 / 2, k3 = exp(l) - 1 - l.

        l = ln 2: k1 -.693147, k2 .240227, k3 2 - 1 - .693147 = .306853
    """
    safe_BT = log_ratio_BT.clamp(min=-SAFETY_BOUND, max=SAFETY_BOUND)
    if estimator == "k1":
        return -safe_BT
    return 0.5 * safe_BT ** 2 if estimator == "k2" else torch.exp(safe_BT) - 1.0 - safe_BT


def _ratio(level_log_ratio_BT: torch.Tensor) -> torch.Tensor:
    return torch.exp(level_log_ratio_BT.clamp(min=-SAFETY_BOUND, max=SAFETY_BOUND))


def check_is_threshold(threshold: float, name: str = "threshold") -> None:
    """ValueError naming `name` unless the truncation threshold is > 0."""
    if not threshold > 0:
        raise ValueError(f"{name} must be > 0 (e.g. 2.0), got {threshold}")


def check_bounds(upper: float, lower: float | None = None, upper_name: str = "upper",
                 lower_name: str = "lower") -> None:
    """ValueError naming the bound when one is <= 0, or when lower (1 / upper if None) exceeds upper."""
    if not upper > 0:
        raise ValueError(f"{upper_name} must be > 0 (e.g. 2.0), got {upper}")
    if lower is not None and not lower > 0:
        raise ValueError(f"{lower_name} must be > 0 or None (1 / {upper_name}), got {lower}")
    if (1.0 / upper if lower is None else lower) > upper:
        raise ValueError(f"{lower_name} (default 1 / {upper_name}) must be <= {upper_name}={upper}, got {lower}")


@torch.no_grad()
def truncated_is_weights(log_ratio_BT: torch.Tensor, mask_BT: torch.Tensor, level: str = "token",
                         threshold: float = 2.0, lower: float | None = None,
                         batch_normalize: bool = False) -> torch.Tensor:
    """Truncated importance sampling (TIS): min(exp(level log ratio), threshold), detached, 0 on padding.

    verl's compute_rollout_correction_weights: with a float threshold (TIS) the
    weights are truncated; with `lower` (IcePop, verl's "lower_upper" string)
    a weight outside [lower, threshold] is 0 and the others are kept as they
    are. `batch_normalize` divides by their mean (over valid tokens at "token"
    level, over rows' weights otherwise) when it is > 1e-8. The weights
    multiply the per-token policy loss and carry no gradient.

        log rho [ln 3, ln .5, 0], mask [1, 1, 0], token, threshold 2 -> [2, .5, 0]
        IcePop lower .6: [0, 0, 0] (3 > 2, .5 < .6); normalised TIS: [2, .5] / 1.25 -> [1.6, .4, 0]
    """
    check_level(level)
    check_is_threshold(threshold)
    if lower is not None:
        check_bounds(threshold, lower, "threshold", "lower")
    level_BT = level_log_ratio(log_ratio_BT, mask_BT, level)
    valid_BT = valid_mask(mask_BT, level_BT)
    ratio_BT = _ratio(level_BT)
    if lower is None:
        weights_BT = ratio_BT.clamp(max=threshold)
    else:
        weights_BT = torch.where((ratio_BT >= lower) & (ratio_BT <= threshold), ratio_BT, 0)
    weights_BT = torch.where(valid_BT, weights_BT, 0)
    return batch_normalized(weights_BT, mask_BT, level) if batch_normalize else weights_BT


@torch.no_grad()
def mean_weight(weights_BT: torch.Tensor, mask_BT: torch.Tensor, level: str) -> torch.Tensor:
    """The mean IS weight batch normalisation divides by: over valid tokens at "token" level, else over
    rows with a valid token of each row's mean weight (verl's rollout_is_batch_norm_factor).

        weights [[2, 2, 0], [.5, 0, 0]], mask [[1, 1, 0], [1, 0, 0]]: token 4.5 / 3 = 1.5; sequence 2.5 / 2
    """
    if level == "token":
        return masked_mean(weights_BT, mask_BT)
    return masked_mean(masked_mean(weights_BT, mask_BT, dim=-1), mask_BT.bool().any(-1))


@torch.no_grad()
def batch_normalized(weights_BT: torch.Tensor, mask_BT: torch.Tensor, level: str) -> torch.Tensor:
    """weights / mean_weight when that mean is > 1e-8, else the weights unchanged (as verl)."""
    mean = mean_weight(weights_BT, mask_BT, level)
    return weights_BT / mean if mean > NORM_EPS else weights_BT


@torch.no_grad()
def rejection_keep_mask(log_ratio_BT: torch.Tensor, mask_BT: torch.Tensor, level: str = "token",
                        upper: float = 2.0, lower: float | None = None, estimator: str = "k1") -> torch.Tensor:
    """Rejection sampling (masked IS): the valid tokens a rejection keeps, a bool tensor, False on padding.

    estimator "k1" (verl's ratio-bound compute_rollout_rejection_mask): keep where
    lower <= exp(level log ratio) <= upper, bounds included; `lower` defaults to
    1 / upper. "k2" / "k3" (verl's token_k2, seq_sum_k3, seq_mean_k2, seq_max_k3, ...):
    keep where the token divergence, or its row sum ("sequence"), mean
    ("geometric") or max ("max"), is <= upper; `lower` must be None. At "token"
    level single tokens are dropped, at the others whole rows.

        log rho [ln 3, ln .6, ln .4], token, upper 2 (lower .5) -> [False, True, False]
        k3 of ln 2, ln 1, ln 3: [.306853, 0, .901388]; token k3, upper .5 -> [True, True, False]
    """
    check_estimator(estimator, level)
    if estimator == "k1":
        check_bounds(upper, lower)
        lower = 1.0 / upper if lower is None else lower
        ratio_BT = _ratio(level_log_ratio(log_ratio_BT, mask_BT, level))
        return (ratio_BT >= lower) & (ratio_BT <= upper) & valid_mask(mask_BT, ratio_BT)
    if lower is not None:
        raise ValueError(f"lower: the {estimator} rejection has an upper bound only, got lower={lower}")
    check_is_threshold(upper, "upper")
    valid_BT = valid_mask(mask_BT, log_ratio_BT)
    token_BT = torch.where(valid_BT, token_divergence(log_ratio_BT, estimator), 0)
    return (level_log_ratio(token_BT, mask_BT, level) <= upper) & valid_BT


@torch.no_grad()
def masked_fraction(keep_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Fraction of valid tokens that `keep_BT` drops (verl's rollout_rs_masked_fraction).

        keep [1, 0, 0], mask [1, 1, 0] -> 1 of 2 valid tokens dropped = .5
    """
    dropped_BT = (~keep_BT.bool()).to(torch.float32)
    return masked_mean(dropped_BT, mask_BT)


@torch.no_grad()
def mismatch_metrics(old_logprobs_BT: torch.Tensor, rollout_logprobs_BT: torch.Tensor,
                     mask_BT: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far the trainer's old logprobs are from the sampler's, over valid tokens.

    - "kl": mean of rollout - old, the k1 estimate of KL(pi_rollout || pi_old)
      on tokens sampled from pi_rollout (verl's rollout_corr/kl).
    - "k3_kl": mean of rho - log rho - 1, the k3 estimate of the same KL
      (verl's rollout_corr/k3_kl; log rho clamped to [-20, 20] here).
    - "max_abs_diff": max |old - rollout| (0 without valid tokens).
    """
    valid_BT = valid_mask(mask_BT, old_logprobs_BT)
    log_rho_BT = log_ratio(old_logprobs_BT, rollout_logprobs_BT, mask_BT)
    safe_BT = log_rho_BT.clamp(min=-SAFETY_BOUND, max=SAFETY_BOUND)
    k3_BT = torch.exp(safe_BT) - safe_BT - 1
    abs_BT = torch.where(valid_BT, log_rho_BT.abs(), 0)
    return {
        "kl": masked_mean(-log_rho_BT, valid_BT),
        "k3_kl": masked_mean(k3_BT, valid_BT),
        "max_abs_diff": abs_BT.max() if abs_BT.numel() else abs_BT.new_zeros(()),
    }


@torch.no_grad()
def is_weight_metrics(weights_BT: torch.Tensor, log_ratio_BT: torch.Tensor, mask_BT: torch.Tensor,
                      level: str, threshold: float, lower: float | None = None) -> dict[str, torch.Tensor]:
    """"is_weight_mean": mean truncated weight over valid tokens (verl's rollout_is_mean);
    "is_truncated_fraction": fraction of valid tokens whose level ratio exceeded `threshold`
    (verl's rollout_is_ratio_fraction_high, per token at every level), or with IcePop's `lower` lay
    outside [lower, threshold] (verl's rollout_is_oob_ratio)."""
    ratio_BT = _ratio(level_log_ratio(log_ratio_BT, mask_BT, level))
    above_BT = ratio_BT > threshold if lower is None else (ratio_BT > threshold) | (ratio_BT < lower)
    return {
        "is_weight_mean": masked_mean(weights_BT, mask_BT),
        "is_truncated_fraction": masked_mean(above_BT.to(torch.float32), mask_BT),
    }


__all__ = ["ESTIMATORS", "LEVELS", "RS_LEVELS", "SAFETY_BOUND", "batch_normalized", "check_bounds",
           "check_estimator", "check_is_threshold", "check_level", "is_weight_metrics", "level_log_ratio", "log_ratio",
           "masked_fraction", "mean_weight", "mismatch_metrics", "rejection_keep_mask", "token_divergence",
           "truncated_is_weights"]
