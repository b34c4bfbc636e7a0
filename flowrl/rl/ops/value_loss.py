"""The critic's clipped value loss, verl's compute_value_loss per token."""

from __future__ import annotations

import torch

from flowrl.rl.ops.masked import masked_mean, valid_mask


def clipped_value_loss(values_BT: torch.Tensor, old_values_BT: torch.Tensor, returns_BT: torch.Tensor,
                       mask_BT: torch.Tensor, clip: float = 0.5) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """0.5 * max((v - R)^2, (clip(v, old - c, old + c) - R)^2) per token, 0 on padding.

    `values_BT` are the critic's current predictions, `old_values_BT` those
    from the rollout. Metric "vf_clipfrac": fraction of valid tokens where the
    clipped term is the larger one.
    """
    if clip <= 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    valid_BT = valid_mask(mask_BT, values_BT)
    values_BT = torch.where(valid_BT, values_BT, 0)
    old_BT = torch.where(valid_BT, old_values_BT, 0)
    returns_BT = torch.where(valid_BT, returns_BT, 0)
    clipped_BT = torch.clamp(values_BT, old_BT - clip, old_BT + clip)
    loss1_BT = (values_BT - returns_BT).square()
    loss2_BT = (clipped_BT - returns_BT).square()
    loss_BT = 0.5 * torch.maximum(loss1_BT, loss2_BT)
    with torch.no_grad():
        clipfrac = masked_mean((loss2_BT > loss1_BT).to(loss_BT.dtype), valid_BT)
    return torch.where(valid_BT, loss_BT, 0), {"vf_clipfrac": clipfrac}
