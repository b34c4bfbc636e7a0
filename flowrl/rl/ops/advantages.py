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
    `norm_by_std=False` the advantage is score - group mean (Dr.GRPO, arXiv:2503.20783).
    """
    _check_rows(mask_BT, scores_B=scores_B, group_B=group_B)
    scores_B = _as_float(scores_B)
    mean_B, std_B, count_B = _group_stats(scores_B, group_B)
    adv_B = scores_B - torch.where(count_B > 1, mean_B, 0.0)
    if norm_by_std:
        adv_B = adv_B / (torch.where(count_B > 1, std_B, 1.0) + eps)
    return _broadcast(adv_B, mask_BT)


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

    The return runs backwards over valid tokens only: a mask-0 token (padding,
    or a tool observation between two turns of a multi-turn rollout) neither
    adds its reward nor discounts, it carries the running return across, so
    earlier turns keep the outcome reward (verl's fix for "REINFORCE++ drops
    outcome rewards before multi-turn observation spans"). Trailing padding
    gets 0, since the scan starts at 0. returns are 0 on mask-0 tokens;
    advantages = masked_whiten(returns) over valid tokens.

        rewards [0, x, 1], mask [1, 0, 1], gamma .5 -> returns [.5, 0, 1]
    """
    valid_BT = valid_mask(mask_BT, token_rewards_BT)
    running_B = torch.zeros_like(token_rewards_BT[:, 0])
    return_columns = []
    for t in reversed(range(token_rewards_BT.shape[-1])):
        valid_B = valid_BT[:, t]
        running_B = torch.where(valid_B, token_rewards_BT[:, t] + gamma * running_B, running_B)
        return_columns.append(torch.where(valid_B, running_B, 0))
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


def _group_mean_or_zero(scores_B: torch.Tensor, group_B: torch.Tensor) -> torch.Tensor:
    """Each row's group mean; 0 for a group of one (verl's baseline for singletons)."""
    mean_B, _, count_B = _group_stats(scores_B, group_B)
    return torch.where(count_B > 1, mean_B, 0.0)


def reinforce_pp_baseline(scores_B: torch.Tensor, group_B: torch.Tensor,
                          mask_BT: torch.Tensor) -> torch.Tensor:
    """REINFORCE++-baseline (arXiv:2501.03262): score - group mean, whitened over the batch's valid tokens.

    verl's reinforce_plus_plus_baseline; a group of one has baseline 0. scores
    [1, 0, 2], groups [0, 0, 1], one token each: [.5, -.5, 2] -> mean 2/3,
    unbiased std 1.258 -> [-.1325, -.9272, 1.0596].
    """
    _check_rows(mask_BT, scores_B=scores_B, group_B=group_B)
    scores_B = _as_float(scores_B)
    centred_BT = _broadcast(scores_B - _group_mean_or_zero(scores_B, group_B), mask_BT)
    return masked_whiten(centred_BT, valid_mask(mask_BT, centred_BT))


def gpg(scores_B: torch.Tensor, group_B: torch.Tensor, mask_BT: torch.Tensor,
        f_norm: float = 1.0) -> torch.Tensor:
    """GPG (arXiv:2504.02546), verl's gpg estimator: alpha * (score - group mean) / f_norm.

    alpha = B / (number of rows with a nonzero score), which scales the batch's
    gradient up by the share of rows that carry signal; a group of one has
    baseline 0. scores [1, 0, 0, 0], groups [0, 0, 1, 1]: alpha 4 ->
    [2, -2, 0, 0].
    """
    _check_rows(mask_BT, scores_B=scores_B, group_B=group_B)
    if f_norm <= 0:
        raise ValueError(f"f_norm must be > 0, got {f_norm}")
    scores_B = _as_float(scores_B)
    alpha = scores_B.shape[0] / max(int(torch.count_nonzero(scores_B)), 1)
    return _broadcast(alpha * (scores_B - _group_mean_or_zero(scores_B, group_B)) / f_norm, mask_BT)


def opo(scores_B: torch.Tensor, group_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """OPO (arXiv:2505.23585): score - the group's length-weighted mean score, sum(len * s) / sum(len).

    Lengths count valid tokens; a group of one has baseline 0, as in verl.
    scores [1, 0], lengths [1, 3] (one group): baseline 1/4 -> [.75, -.25].
    """
    _check_rows(mask_BT, scores_B=scores_B, group_B=group_B)
    scores_B = _as_float(scores_B)
    len_B = valid_mask(mask_BT, mask_BT).sum(-1).to(scores_B.dtype)
    _, inverse_B, counts_G = torch.unique(group_B, return_inverse=True, return_counts=True)
    weighted_G = torch.zeros(counts_G.shape, dtype=scores_B.dtype).index_add_(0, inverse_B, len_B * scores_B)
    len_G = torch.zeros(counts_G.shape, dtype=scores_B.dtype).index_add_(0, inverse_B, len_B)
    baseline_G = torch.where(counts_G > 1, weighted_G / len_G.clamp(min=1), 0.0)
    return _broadcast(scores_B - baseline_G[inverse_B], mask_BT)


def grpo_passk(scores_B: torch.Tensor, group_B: torch.Tensor, mask_BT: torch.Tensor,
               eps: float = 1e-6, norm_by_std: bool = True) -> torch.Tensor:
    """GRPO for pass@k (arXiv:2503.19595), verl's grpo_passk: only each group's best row learns.

    Its advantage is r_max - r_second_max (over the group's std + eps with
    norm_by_std), every other row's is 0; ties go to the row torch.topk picks,
    as in verl. Every group needs >= 2 rows. scores [1, 0, .5], one group,
    no std: [.5, 0, 0].
    """
    _check_rows(mask_BT, scores_B=scores_B, group_B=group_B)
    scores_B = _as_float(scores_B)
    adv_B = torch.zeros_like(scores_B)
    for g in torch.unique(group_B):
        rows = (group_B == g).nonzero().squeeze(-1)
        if rows.numel() < 2:
            raise ValueError(f"grpo_passk needs >= 2 samples per group; group {g.item()} has {rows.numel()}")
        top, top_idx = torch.topk(scores_B[rows], 2)
        adv = top[0] - top[1]
        adv_B[rows[top_idx[0]]] = adv / (scores_B[rows].std() + eps) if norm_by_std else adv
    return _broadcast(adv_B, mask_BT)


def optimal_token_baseline(token_rewards_BT: torch.Tensor, mask_BT: torch.Tensor, group_B: torch.Tensor,
                           old_logprobs_BT: torch.Tensor, sum_pi_squared_BT: torch.Tensor,
                           is_weights_BT: torch.Tensor | None = None, handle_zero_tail: bool = True,
                           eps: float = 1e-8) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal token baseline (OTB), verl's optimal_token_baseline: a baseline per group and time step.

    G_t is the return-to-go; w_t = 1 - 2 pi_t + sum_v pi_v^2 (pi_t = exp(old
    logprob), the squared norm of the logit gradient; times the squared IS
    weight when `is_weights_BT` is given), W_t = sum_{j <= t} w_j over valid
    tokens. Each group's baseline at t is B_t = sum_i G_i,t W_i,t /
    (sum_i W_i,t + eps) over its rows valid at t; a group of one has B = 0.
    With `handle_zero_tail`, a group's single longest row gets B = 0 past the
    second-longest row's length (verl's default). Returns (G - B, G), 0 on padding.
    """
    valid_BT = valid_mask(mask_BT, token_rewards_BT)
    returns_BT = torch.where(valid_BT, token_rewards_BT, 0).flip(-1).cumsum(-1).flip(-1)
    returns_BT = torch.where(valid_BT, returns_BT, 0)
    w_BT = 1 - 2 * torch.where(valid_BT, old_logprobs_BT, 0).exp() + torch.where(valid_BT, sum_pi_squared_BT, 0)
    if is_weights_BT is not None:
        w_BT = w_BT * torch.where(valid_BT, is_weights_BT, 0).square()
    cum_w_BT = torch.where(valid_BT, w_BT, 0).cumsum(-1)
    weight_BT = torch.where(valid_BT, cum_w_BT, 0)
    baselines_BT = torch.zeros_like(returns_BT)
    for g in torch.unique(group_B):
        rows = (group_B == g).nonzero().squeeze(-1)
        if rows.numel() < 2:
            continue
        b_T = (returns_BT[rows] * weight_BT[rows]).sum(0) / (weight_BT[rows].sum(0) + eps)
        baselines_BT[rows] = b_T
        lengths = valid_BT[rows].sum(-1)
        longest, second = lengths.sort().values[-1].item(), lengths.sort().values[-2].item()
        if handle_zero_tail and (lengths == longest).sum() == 1 and longest > second:
            baselines_BT[rows[lengths.argmax()], second:] = 0.0
    return torch.where(valid_BT, returns_BT - baselines_BT, 0), returns_BT


def tir_optimal_token_baseline(token_rewards_BT: torch.Tensor, mask_BT: torch.Tensor, group_B: torch.Tensor,
                               old_logprobs_BT: torch.Tensor, sum_pi_squared_BT: torch.Tensor,
                               is_weights_BT: torch.Tensor | None = None, handle_zero_tail: bool = True,
                               eps: float = 1e-8) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB for tool-integrated (multi-turn) rows, verl's tir_optimal_token_baseline: the same baseline with
    time counted in valid tokens, so a row's k-th generated token meets the group's other k-th tokens
    whatever tool observations (mask-0 spans) came before. Each row's valid tokens are packed to the
    left, `optimal_token_baseline` runs there, and the advantages go back to their places; the returns
    are the unpacked ones. Rows without valid tokens join no group.

        mask [[1, 0, 1], [1, 1, 0]], one group: row 0's second valid token (t = 2) meets row 1's t = 1
    """
    valid_BT = valid_mask(mask_BT, token_rewards_BT)
    order_BT = torch.sort((~valid_BT).to(torch.int8), dim=-1, stable=True).indices  # valid tokens first
    packed_mask_BT = valid_BT.gather(-1, order_BT)

    def pack(x_BT: torch.Tensor | None) -> torch.Tensor | None:
        return None if x_BT is None else torch.where(packed_mask_BT, x_BT.gather(-1, order_BT), 0)

    nonempty_B = valid_BT.any(-1)
    group_B = torch.where(nonempty_B, group_B, group_B.max() + 1 + torch.arange(len(group_B)))  # own groups
    packed_adv_BT, _ = optimal_token_baseline(pack(token_rewards_BT), packed_mask_BT, group_B,
                                              pack(old_logprobs_BT), pack(sum_pi_squared_BT), pack(is_weights_BT),
                                              handle_zero_tail, eps)
    adv_BT = torch.zeros_like(packed_adv_BT).scatter(-1, order_BT, packed_adv_BT)
    returns_BT = torch.where(valid_BT, token_rewards_BT, 0).flip(-1).cumsum(-1).flip(-1)
    return torch.where(valid_BT, adv_BT, 0), torch.where(valid_BT, returns_BT, 0)
