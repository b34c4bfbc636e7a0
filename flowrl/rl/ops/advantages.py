"""Advantage estimators, after verl's core_algos.

Every estimator returns [B, T] tensors that are 0 on padding. Outcome
estimators take one score per row (`scores_B`) and `group_B`, an integer
tensor where rows with the same id are samples of the same prompt. All of
them are plain functions of tensors; callers wrap them in no_grad.
"""

from __future__ import annotations

import torch

from flowrl.rl.ops.masked import masked_whiten, valid_mask


def _check_rows(mask_BT: torch.Tensor, **row_tensors: torch.Tensor) -> None:
    """ValueError naming the argument whose shape is not [B] for mask [B, T]."""
    for name, t in row_tensors.items():
        if t.shape != mask_BT.shape[:1]:
            raise ValueError(f"{name} must have shape [B]={list(mask_BT.shape[:1])}, got {list(t.shape)}")


def _as_float(scores_B: torch.Tensor) -> torch.Tensor:
    return scores_B if scores_B.is_floating_point() else scores_B.to(torch.get_default_dtype())


def _broadcast(values_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """values_B on every valid token of its row, 0 on padding."""
    return torch.where(mask_BT.bool(), values_B.unsqueeze(-1), 0)


def _group_stats(scores_B: torch.Tensor, group_B: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-row (group mean, unbiased group std, group size); both stats raw."""
    _, inverse_B, counts_G = torch.unique(group_B, return_inverse=True, return_counts=True)
    counts_G = counts_G.to(scores_B.dtype)
    mean_G = torch.zeros_like(counts_G).index_add_(0, inverse_B, scores_B) / counts_G
    sq_dev_B = (scores_B - mean_G[inverse_B]).square()
    var_G = torch.zeros_like(counts_G).index_add_(0, inverse_B, sq_dev_B) / (counts_G - 1).clamp(min=1)
    return mean_G[inverse_B], var_G.sqrt()[inverse_B], counts_G[inverse_B]


def group_std(scores_B: torch.Tensor, group_B: torch.Tensor) -> torch.Tensor:
    """Each row's unbiased (torch.std) group std; a group of one has std 1.

    Std 1 for singletons matches grpo, and makes `group_std(...) > 0` the
    DAPO dynamic-sampling filter of verl, which keeps groups with nonzero std
    and groups of one. scores [1, 0, 1, 1], groups [0, 0, 1, 1] -> [.7071,
    .7071, 0, 0].
    """
    if group_B.shape != scores_B.shape:
        raise ValueError(f"group_B must have the shape of scores_B {list(scores_B.shape)}, got {list(group_B.shape)}")
    scores_B = _as_float(scores_B)
    _, std_B, count_B = _group_stats(scores_B, group_B)
    return torch.where(count_B > 1, std_B, 1.0)


def grpo(scores_B: torch.Tensor, group_B: torch.Tensor, mask_BT: torch.Tensor,
         eps: float = 1e-6, norm_by_std: bool = True) -> torch.Tensor:
    """(score - group mean) / (group std + eps) on every valid token.

    The std is unbiased (torch.std); a group of one has mean 0 and std 1, so
    its advantage is its score (/ (1 + eps)), as in verl. With
    `norm_by_std=False` the advantage is score - group mean (Dr.GRPO).
    """
    _check_rows(mask_BT, scores_B=scores_B, group_B=group_B)
    scores_B = _as_float(scores_B)
    mean_B, std_B, count_B = _group_stats(scores_B, group_B)
    adv_B = scores_B - torch.where(count_B > 1, mean_B, 0.0)
    if norm_by_std:
        adv_B = adv_B / (torch.where(count_B > 1, std_B, 1.0) + eps)
    return _broadcast(adv_B, mask_BT)


def dr_grpo(scores_B: torch.Tensor, group_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Dr.GRPO (arXiv:2503.20783): grpo without the std normalisation."""
    return grpo(scores_B, group_B, mask_BT, norm_by_std=False)


def rloo(scores_B: torch.Tensor, group_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline (arXiv:2402.14740): score - mean of the others.

    Computed as verl does, score * n/(n-1) - group mean * n/(n-1). A group of
    one has no other sample: its advantage is its raw score, as in verl.
    """
    _check_rows(mask_BT, scores_B=scores_B, group_B=group_B)
    scores_B = _as_float(scores_B)
    mean_B, _, n_B = _group_stats(scores_B, group_B)
    scale_B = n_B / (n_B - 1).clamp(min=1)
    adv_B = torch.where(n_B > 1, (scores_B - mean_B) * scale_B, scores_B)
    return _broadcast(adv_B, mask_BT)


def gae(token_rewards_BT: torch.Tensor, values_BT: torch.Tensor, mask_BT: torch.Tensor,
        gamma: float = 1.0, lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation, verl's compute_gae_advantage_return.

    Padding tokens are skipped: the recursion carries the next valid token's
    value and advantage across them. returns = advantages + values, taken
    before the advantages are whitened over valid tokens.
    """
    valid_BT = valid_mask(mask_BT, token_rewards_BT)
    rewards_BT = torch.where(valid_BT, token_rewards_BT, 0)
    values_BT = torch.where(valid_BT, values_BT, 0)
    next_value_B = torch.zeros_like(rewards_BT[:, 0])
    last_adv_B = torch.zeros_like(next_value_B)
    adv_columns = []
    for t in reversed(range(rewards_BT.shape[-1])):
        delta_B = rewards_BT[:, t] + gamma * next_value_B - values_BT[:, t]
        valid_B = valid_BT[:, t]
        last_adv_B = torch.where(valid_B, delta_B + gamma * lam * last_adv_B, last_adv_B)
        next_value_B = torch.where(valid_B, values_BT[:, t], next_value_B)
        adv_columns.append(last_adv_B)
    adv_BT = torch.stack(adv_columns[::-1], dim=-1)
    returns_BT = torch.where(valid_BT, adv_BT + values_BT, 0)
    return masked_whiten(adv_BT, valid_BT), returns_BT


def reinforce_pp(token_rewards_BT: torch.Tensor, mask_BT: torch.Tensor,
                 gamma: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (arXiv:2501.03262): whitened discounted return-to-go.

    The return restarts at every padding token, as verl's reset after EOS;
    advantages = masked_whiten(returns) over valid tokens.
    """
    valid_BT = valid_mask(mask_BT, token_rewards_BT)
    running_B = torch.zeros_like(token_rewards_BT[:, 0])
    return_columns = []
    for t in reversed(range(token_rewards_BT.shape[-1])):
        running_B = torch.where(valid_BT[:, t], token_rewards_BT[:, t] + gamma * running_B, 0)
        return_columns.append(running_B)
    returns_BT = torch.stack(return_columns[::-1], dim=-1)
    return masked_whiten(returns_BT, valid_BT), returns_BT


def remax(scores_B: torch.Tensor, baseline_B: torch.Tensor,
          mask_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (arXiv:2310.10505): advantage = return - greedy-rollout baseline.

    The score is the reward of the last valid token, so its return-to-go is
    the score on every valid token; advantages = returns - baseline there.
    """
    _check_rows(mask_BT, scores_B=scores_B, baseline_B=baseline_B)
    scores_B = _as_float(scores_B)
    returns_BT = _broadcast(scores_B, mask_BT)
    return _broadcast(scores_B - baseline_B, mask_BT), returns_BT
