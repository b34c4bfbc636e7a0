"""GDPO (arXiv:2601.05242), verl's "gdpo" estimator: each reward component normalised in its group apart.

GRPO sums the reward components first, so one with a large spread drowns the
others; GDPO runs GRPO on each component separately, adds the results with
per-component weights and whitens the sum over the batch's valid tokens.
"""

from __future__ import annotations

import torch

from flowrl.rl.ops.advantages import grpo
from flowrl.rl.ops.masked import masked_whiten


def gdpo(scores_BK: torch.Tensor, group_B: torch.Tensor, mask_BT: torch.Tensor,
         weights_K: torch.Tensor | list[float] | None = None, eps: float = 1e-6,
         norm_by_std: bool = True) -> torch.Tensor:
    """whiten(sum_k w_k * grpo(scores[:, k])) over valid tokens, 0 on padding.

    scores_BK: one column per reward component ([B] is one component, verl's
    fallback to the plain score); weights_K default 1 each. The whitening is
    verl's masked_whiten (unbiased variance, token-weighted: a longer row
    counts more). A batch with one valid token has variance 0 and gives 0.

        one component, one group, scores [1, 0, 0], one token each: GRPO
        [2/3, -1/3, -1/3] / std .57735 = [1.1547, -.57735, -.57735]; whitened
        (mean 0, unbiased var 1) -> [1.1547, -.57735, -.57735]
    """
    scores_BK = scores_BK.unsqueeze(-1) if scores_BK.dim() == 1 else scores_BK
    num_components = scores_BK.shape[-1]
    weights_K = torch.ones(num_components) if weights_K is None else torch.as_tensor(weights_K, dtype=torch.float32)
    if weights_K.shape != (num_components,):
        raise ValueError(f"weights_K must have one weight per reward component ({num_components}), "
                         f"got shape {list(weights_K.shape)}")
    total_BT = sum(weights_K[k] * grpo(scores_BK[:, k], group_B, mask_BT, eps=eps, norm_by_std=norm_by_std)
                   for k in range(num_components))
    return masked_whiten(total_BT, mask_BT)


__all__ = ["gdpo"]
