"""Loss aggregation: a [B, T] token-loss matrix to one scalar.

Each mode is a mean in its own unit: valid tokens for "token-mean", sequences
for the "seq-*" modes. `agg_weight` is a micro-batch's count in that unit, so
sum_i agg_loss(mb_i) * w_i / sum_i w_i is exactly agg_loss of the whole batch.

A "sequence" is a row with at least one valid token: all-padding rows (such
as rows added to even out micro-batches across ranks) count for nothing.
verl counts them as rows (and its seq-mean-token-mean turns them into NaN).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from flowrl.rl.ops.masked import masked_mean, masked_sum, valid_mask

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                  "token-sum"]
AGG_MODES: tuple[str, ...] = get_args(AggMode)
SUM_MODES: tuple[str, ...] = ("token-sum",)
"""Modes that are sums, not means: a batch's loss is the sum of its micro-batches' losses (agg_weight 1 each)."""


def check_agg_mode(mode: str) -> None:
    """ValueError naming `loss_agg_mode` unless `mode` is one of AGG_MODES."""
    if mode not in AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {AGG_MODES}, got {mode!r}")


def num_sequences(mask_BT: torch.Tensor) -> int:
    """Rows with at least one valid token."""
    return int(mask_BT.bool().any(dim=-1).sum())


def agg_loss(loss_BT: torch.Tensor, mask_BT: torch.Tensor, mode: str,
             norm_len: int | None = None, kept_BT: torch.Tensor | None = None) -> torch.Tensor:
    """Aggregate `loss_BT` over valid tokens to a scalar (0 when none are valid).

    - "token-mean": sum of valid token losses / number of valid tokens.
    - "token-sum": sum of valid token losses (verl's token-sum, e.g. for a KL
      term that should not shrink with the batch's length).
    - "seq-mean-token-sum": mean over sequences of each sequence's token sum.
    - "seq-mean-token-mean": mean over sequences of each sequence's token mean.
    - "seq-mean-token-sum-norm" (Dr.GRPO): sum of valid token losses /
      (num sequences * norm_len); norm_len defaults to T. verl divides by T
      alone. Pass the max response length as `norm_len` so that micro-batches
      padded to different T share one normaliser. Ignored by other modes.

    kept_BT (rollout rejection's keep mask): in "seq-mean-token-mean" a row's
    token mean is over its kept tokens, as verl's (which sees the rejection in
    response_mask); every count (tokens, rows) stays the mask's, so agg_weight
    needs no forward pass. Rejected tokens' losses must already be 0.

        loss [[1, 2, 3]], mask [[1, 1, 1]], kept [[1, 1, 0]] -> (1 + 2) / 2 = 1.5
    """
    check_agg_mode(mode)
    if mode == "token-mean":
        return masked_mean(loss_BT, mask_BT)
    if mode == "token-sum":
        return masked_sum(loss_BT, mask_BT)
    num_seqs = max(num_sequences(mask_BT), 1)
    if mode == "seq-mean-token-sum":
        return masked_sum(loss_BT, mask_BT, dim=-1).sum() / num_seqs
    if mode == "seq-mean-token-mean":
        row_mask_BT = mask_BT if kept_BT is None else valid_mask(mask_BT, loss_BT) & kept_BT.bool()
        return masked_mean(loss_BT, row_mask_BT, dim=-1).sum() / num_seqs
    norm_len = loss_BT.shape[-1] if norm_len is None else norm_len
    if norm_len <= 0:
        raise ValueError(f"norm_len must be > 0, got {norm_len}")
    return masked_sum(loss_BT, mask_BT) / (num_seqs * norm_len)


def agg_weight(mask_BT: torch.Tensor, mode: str) -> float:
    """A micro-batch's count in `mode`'s unit: valid tokens or sequences; for a sum mode 1 when it has a
    valid token (its loss adds in whole), else 0.

        mask [[1, 1, 0], [1, 0, 0]]: token-mean -> 3 tokens, seq-* -> 2 rows, token-sum -> 1
    """
    check_agg_mode(mode)
    if mode in SUM_MODES:
        return float(num_sequences(mask_BT) > 0)
    if mode == "token-mean":
        return float(valid_mask(mask_BT, mask_BT).sum())
    return float(num_sequences(mask_BT))


__all__ = ["AGG_MODES", "SUM_MODES", "agg_loss", "agg_weight", "check_agg_mode", "num_sequences"]
