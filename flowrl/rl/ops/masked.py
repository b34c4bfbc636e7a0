"""Masked reductions: statistics over valid entries only.

A mask is binary: any nonzero (or True) entry is valid, zero is padding.
Padding never contributes, whatever it holds (NaN and inf included): values
are selected with `torch.where`, never multiplied by the mask, so garbage in
padding neither leaks into a result nor into a gradient.
"""

from __future__ import annotations

import torch


def valid_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`mask` as a bool tensor broadcast to `like`'s shape."""
    return mask.bool().expand(like.shape)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x` over valid entries (all of them, or along `dim`), float32 at least.

        x [1, 2, 9], mask [1, 1, 0] -> 1 + 2 = 3
    """
    picked = torch.where(valid_mask(mask, x), x, 0)
    dtype = torch.promote_types(x.dtype, torch.float32)  # a bf16 sum rounds 999 to 1000
    return picked.sum(dtype=dtype) if dim is None else picked.sum(dim=dim, dtype=dtype)


def masked_count(mask: torch.Tensor, like: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Number of valid entries, as floats (float32 at least: bf16 miscounts past 256)."""
    valid = valid_mask(mask, like).to(torch.promote_types(like.dtype, torch.float32))
    return valid.sum() if dim is None else valid.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over valid entries; 0 where there are none (verl gives NaN).

        x [1, 2, 9], mask [1, 1, 0] -> (1 + 2) / 2 = 1.5
    """
    return masked_sum(x, mask, dim) / masked_count(mask, x, dim).clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `x` over all valid entries, Bessel-corrected when `unbiased`.

        x [1, 2, 3, 100], mask [1, 1, 1, 0]: mean 2, squared deviations 1, 0, 1
        -> biased 2/3, unbiased 2/3 * 3/2 = 1

    Raises ValueError when the mask has no valid entry (as verl does). With a
    single valid entry the correction n/(n-1) is undefined; this returns the
    biased variance 0 there, where verl returns NaN.
    """
    num_valid = int(valid_mask(mask, x).sum())
    if num_valid == 0:
        raise ValueError("mask: no valid entries, the variance is undefined")
    centered = x - masked_mean(x, mask)
    var = masked_mean(centered * centered, mask)
    if unbiased and num_valid > 1:
        var = var * num_valid / (num_valid - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) with masked statistics, 0 on padding.

    Matches verl's masked_whiten (unbiased variance); with `shift_mean=False`
    the original mean is added back, keeping only the rescaling.

        x [1, 2, 3, 100], mask [1, 1, 1, 0]: mean 2, var 1 -> [-1, 0, 1, 0]
    """
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(valid_mask(mask, x), whitened, 0)
