"""Reward shaping: outcome scores to token rewards, DAPO's overlong penalty, KL in reward."""

from __future__ import annotations

import torch

from flowrl.rl.ops.masked import valid_mask


def token_rewards(scores_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Each row's score on its last valid token, 0 elsewhere.

    A row without valid tokens gets nothing. scores [2, 3], mask [[1, 1, 0],
    [1, 1, 1]] -> [[0, 2, 0], [0, 0, 3]].
    """
    if scores_B.shape != mask_BT.shape[:1]:
        raise ValueError(f"scores_B must have shape [B]={list(mask_BT.shape[:1])}, got {list(scores_B.shape)}")
    scores_B = scores_B if scores_B.is_floating_point() else scores_B.to(torch.get_default_dtype())
    valid_BT = mask_BT.bool()
    positions_T = torch.arange(mask_BT.shape[-1], device=mask_BT.device)
    last_B = torch.where(valid_BT, positions_T, -1).amax(dim=-1)
    at_last_BT = positions_T == last_B.unsqueeze(-1)  # never true for last == -1
    return torch.where(at_last_BT, scores_B.unsqueeze(-1), 0)


def overlong_penalty(response_len_B: torch.Tensor, max_len: int, buffer_len: int,
                     penalty_factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (arXiv:2503.14476), a penalty <= 0 per row.

    With L_safe = max_len - buffer_len: 0 when len <= L_safe, linear
    -(len - L_safe) / buffer_len * factor inside the buffer, -factor from
    max_len on. max_len 10, buffer 4, len [6, 8, 12] -> [0, -.5, -1].
    """
    if max_len <= 0:
        raise ValueError(f"max_len must be > 0, got {max_len}")
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"buffer_len must be in (0, max_len={max_len}], got {buffer_len}")
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")
    excess_B = response_len_B.to(torch.get_default_dtype()) - (max_len - buffer_len)
    return -torch.clamp(excess_B / buffer_len, min=0.0, max=1.0) * penalty_factor


def kl_in_reward(token_rewards_BT: torch.Tensor, kl_BT: torch.Tensor, kl_coef: float,
                 mask_BT: torch.Tensor | None = None) -> torch.Tensor:
    """token rewards - kl_coef * kl (verl's apply_kl_penalty), 0 on padding if `mask_BT` is given."""
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    shaped_BT = token_rewards_BT - kl_coef * kl_BT
    if mask_BT is None:
        return shaped_BT
    return torch.where(valid_mask(mask_BT, shaped_BT), shaped_BT, 0)


PF_PPO_METHODS = ("pow", "max_min", "max_random")


def pf_ppo_weights(scores_B: torch.Tensor, method: str = "pow", weight_pow: float = 2.0) -> torch.Tensor:
    """PF-PPO's (arXiv:2409.06957) sampling weight per row from its score, verl's compute_pf_ppo_reweight_data.

    - "pow": |score| ** weight_pow;
    - "max_min": 1 for rows at the batch's max or min score, else 0;
    - "max_random": .4 for rows at the max, .1 for the others;
    then + 1e-8 (so every row keeps a chance). scores [1, -2, .5]: pow 2 ->
    [1, 4, .25]; max_min -> [1, 1, 0]; max_random -> [.4, .1, .1].
    """
    if method not in PF_PPO_METHODS:
        raise ValueError(f"reweight_method must be one of {PF_PPO_METHODS}, got {method!r}")
    scores_B = scores_B if scores_B.is_floating_point() else scores_B.to(torch.get_default_dtype())
    if method == "pow":
        weights_B = scores_B.abs().pow(weight_pow)
    elif method == "max_min":
        weights_B = ((scores_B == scores_B.max()) | (scores_B == scores_B.min())).to(scores_B.dtype)
    else:
        weights_B = torch.where(scores_B == scores_B.max(), 0.4, 0.1).to(scores_B.dtype)
    return torch.clamp(weights_B + 1e-8, min=1e-8)


def pf_ppo_resample(scores_B: torch.Tensor, method: str = "pow", weight_pow: float = 2.0,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """B row indices drawn with replacement in proportion to pf_ppo_weights (torch.multinomial, as verl)."""
    weights_B = pf_ppo_weights(scores_B, method, weight_pow)
    return torch.multinomial(weights_B, scores_B.shape[0], replacement=True, generator=generator)
