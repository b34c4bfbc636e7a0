"""Loop-by-loop restatements of verl's estimators and losses (verl/trainer/ppo/core_algos.py, 0.9-0.10).

Each follows verl's computation step for step (python dicts of groups, the same
torch calls where the result depends on them: topk, randperm), written for
these tests; flowrl's vectorised ops are compared against them on random inputs.
"""

from collections import defaultdict

import torch


def whiten(x, mask, eps=1e-8):
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = (((x - mean) ** 2) * mask).sum() / n * n / (n - 1)
    return (x - mean) * torch.rsqrt(var + eps)


def masked_mean(x, mask, dim=None):
    return (x * mask).sum() / mask.sum() if dim is None else (x * mask).sum(dim) / mask.sum(dim)


def _groups(index):
    out = defaultdict(list)
    for i, g in enumerate(index):
        out[int(g)].append(i)
    return out


def reinforce_pp(rewards, mask, gamma):
    returns, running = torch.zeros_like(rewards), 0
    for t in reversed(range(rewards.shape[1])):
        new = rewards[:, t] + gamma * running
        returns[:, t] = new * mask[:, t]
        running = new * mask[:, t] + running * (1 - mask[:, t])
    return whiten(returns, mask) * mask, returns


def reinforce_pp_baseline(scores, mask, index):
    scores = scores.clone()
    for rows in _groups(index).values():
        mean = scores[rows].mean() if len(rows) > 1 else 0.0
        for i in rows:
            scores[i] = scores[i] - mean
    tiled = scores.unsqueeze(-1) * mask
    return whiten(tiled, mask) * mask


def gpg(scores, mask, index, f_norm=1.0):
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
    out = scores.clone()
    for rows in _groups(index).values():
        mean = scores[rows].mean() if len(rows) > 1 else 0.0
        for i in rows:
            out[i] = alpha * (scores[i] - mean) / f_norm
    return out.unsqueeze(-1) * mask


def opo(scores, mask, index):
    lengths, out = mask.sum(-1), scores.clone()
    for rows in _groups(index).values():
        baseline = (lengths[rows] * scores[rows]).sum() / lengths[rows].sum() if len(rows) > 1 else 0.0
        for i in rows:
            out[i] = scores[i] - baseline
    return out.unsqueeze(-1) * mask


def grpo_passk(scores, mask, index, eps=1e-6, norm_by_std=True):
    out = torch.zeros_like(scores)
    for rows in _groups(index).values():
        rewards = scores[rows]
        top, top_idx = torch.topk(rewards, 2)
        adv = top[0] - top[1]
        out[rows[top_idx[0].item()]] = adv / (torch.std(rewards) + eps) if norm_by_std else adv
    return out.unsqueeze(-1) * mask


def optimal_token_baseline(rewards, mask, index, old_logprobs, sum_pi_squared, is_weights=None,
                           handle_zero_tail=True, eps=1e-8):
    # compute_optimal_token_baseline_advantage, verl-project/verl 1dda039 (2026-08-22); its trainer
    # (ray_trainer.compute_advantage) never passes handle_zero_tail, so it runs with the default True
    returns = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
    w = 1 - 2 * old_logprobs.exp() + sum_pi_squared
    if is_weights is not None:
        w = w * is_weights ** 2
    w_cum = (w * mask).cumsum(-1)
    baselines = torch.zeros_like(returns)
    for rows in _groups(index).values():
        if len(rows) == 1:
            continue
        idx = torch.tensor(rows)
        b = (returns[idx] * w_cum[idx] * mask[idx]).sum(0) / ((w_cum[idx] * mask[idx]).sum(0) + eps)
        baselines[idx] = b.unsqueeze(0).expand(len(rows), -1)
        if handle_zero_tail:
            lengths = mask[idx].sum(-1)
            ordered = torch.sort(lengths).values
            longest, second = int(ordered[-1]), int(ordered[-2])
            at_max = (lengths == longest).nonzero(as_tuple=True)[0]
            if at_max.numel() == 1 and longest > second:
                baselines[rows[int(at_max[0])], second:] = 0.0
    return (returns - baselines) * mask


def sapo_tokens(old, logp, adv, tau_pos=1.0, tau_neg=1.05):
    ratio = torch.exp(torch.clamp(logp - old, -20, 20))
    taus = torch.where(adv > 0, torch.tensor(tau_pos), torch.tensor(tau_neg))
    return -torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus) * adv


def seq_mean_token_mean(loss, mask):
    per_row = (loss * mask).sum(-1) / (mask.sum(-1) + 1e-8)
    rows = (mask.sum(-1) > 0).float()
    return (per_row * rows).sum() / rows.sum()


def geo_mean(old, logp, adv, mask, clip_low, clip_high, rollout_is_weights=None):
    # compute_policy_loss_geo_mean, verl-project/verl 1dda039 (2026-08-22), rollout IS weights included
    log_ratio = logp - old
    sgn = torch.sign(adv)
    clamped = torch.clamp(log_ratio, -clip_low, clip_high)
    picked = sgn * torch.min(sgn * log_ratio, sgn * clamped)
    n = mask.sum(-1)
    ratio = torch.exp((picked * mask).sum(-1) / (n + 1e-8))
    seq_adv = (adv * mask).sum(-1) / (n + 1e-8)
    losses = -seq_adv * ratio
    if rollout_is_weights is not None:
        losses = losses * torch.exp((torch.log(rollout_is_weights + 1e-10) * mask).sum(-1) / (n + 1e-8))
    return torch.mean(losses)


def rollout_is_weights(log_ratio, mask, level="token", threshold=2.0):
    # rollout_corr_helper.compute_rollout_correction_weights (TIS, float threshold), verl-project/verl 1dda039
    if level == "token":
        raw = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
    else:
        log_sum = (log_ratio * mask).sum(-1, keepdim=True)
        raw = torch.exp(torch.clamp(log_sum, -20.0, 20.0)).expand_as(log_ratio)
    return (raw * mask).clamp(max=threshold)


def kl_cov_tokens(old, logp, adv, mask, kl_cov_ratio, coef):
    log_ratio = logp - old
    ratio = torch.exp(log_ratio)
    losses = -adv * ratio
    with_kl = -adv * ratio + coef * log_ratio.abs()
    valid = mask > 0
    valid_idx = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    a, lp = adv[valid].detach().reshape(-1), logp[valid].detach().reshape(-1)
    cov = (a - a.mean()) * (lp - lp.mean())
    top = valid_idx[torch.topk(cov, max(1, int(len(cov) * kl_cov_ratio)), largest=True).indices]
    width = adv.shape[1]
    losses[top // width, top % width] = with_kl[top // width, top % width]
    return losses


def clip_cov_tokens(old, logp, adv, mask, clip, ratio_, lb, ub, generator):
    ratio = torch.exp(logp - old)
    loss1 = -adv * ratio
    loss2 = -adv * torch.clamp(ratio, 1 - clip, 1 + clip)
    by_origin = (loss2 > loss1) & (mask > 0)
    cov = (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp.detach(), mask))
    cov[mask == 0] = -torch.inf
    cov[by_origin] = -torch.inf
    num = max(int(ratio_ * mask.sum().item()), 1)
    idx = torch.nonzero((cov < ub) & (cov > lb) & (mask > 0))
    corr = torch.ones_like(adv)
    if len(idx):
        idx = idx[torch.randperm(len(idx), generator=generator)[:min(num, len(idx))]]
        corr[idx[:, 0], idx[:, 1]] = 0
    return torch.maximum(loss1, loss2) * corr


def kl_straight_through(logp, ref, base):
    log_ratio = logp - ref
    forward = {"k1": log_ratio, "abs": log_ratio.abs(), "k2": 0.5 * log_ratio ** 2,
               "k3": torch.clamp(torch.exp(torch.clamp(-log_ratio, -20, 20)) + log_ratio - 1, -10, 10)}[base]
    backward = 0.5 * log_ratio.square()
    return backward - backward.detach() + forward.detach()


def pf_ppo_weights(scores, method, weight_pow):
    if method == "pow":
        w = torch.pow(torch.abs(scores), weight_pow)
    elif method == "max_min":
        w = torch.where((scores == scores.max()) | (scores == scores.min()), 1.0, 0.0)
    else:
        w = torch.where(scores == scores.max(), 0.4, 0.1)
    return torch.clamp(w + 1e-8, min=1e-8)


# --- rollout correction, rollout_corr_helper.py at verl v0.9.0 (unchanged to 1dda039) ---

def _seq_sum(x, mask):
    return (x * mask).sum(-1)


def _seq_mean(x, mask):
    return (x * mask).sum(-1) / (mask.sum(-1) + 1e-8)


def _seq_max(x, mask):
    # _sequence_max: masked_fill(~mask, -inf).max(-1), then 0 for a row without valid tokens
    v = x.masked_fill(~mask.bool(), float("-inf")).max(-1).values
    return torch.where(v == float("-inf"), torch.zeros_like(v), v)


def rollout_rejection_mask(log_ratio, mask, option, upper, lower=None):
    # compute_rollout_rejection_mask with one option: k1 options bound -log_ratio in [log lower, log upper]
    # (lower defaults to 1 / upper), k2 / k3 options bound the divergence above by `upper`
    import math
    safe = torch.clamp(log_ratio, -20.0, 20.0)
    stats = {"k1": -safe, "k2": 0.5 * safe ** 2, "k3": torch.exp(safe) - 1.0 - safe}
    kind = option[-2:]
    if kind == "k1":
        lower = 1.0 / upper if lower is None else lower

        def keep(s):
            return (s >= math.log(lower)) & (s <= math.log(upper))
    else:
        def keep(s):
            return s <= upper
    if option.startswith("token"):
        keep_bt = keep(stats[kind])
    else:
        reduce = {"seq_sum": _seq_sum, "seq_mean": _seq_mean, "seq_max": _seq_max}[option[:-3]]
        keep_bt = keep(reduce(stats[kind], mask)).unsqueeze(-1).expand_as(mask)
    return (mask * keep_bt.to(log_ratio.dtype)).to(mask.dtype)


def rollout_correction_weights(log_ratio, mask, level="token", upper=2.0, lower=None, batch_normalize=False):
    # compute_rollout_correction_weights: TIS (lower None) clamps at upper, IcePop zeroes weights outside
    # [lower, upper]; batch normalisation divides by the masked token mean (token) or the mean over
    # non-empty rows of each row's mean weight (sequence), when that mean is > 1e-8
    if level == "token":
        raw = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
    else:
        log_sum = (log_ratio * mask).sum(-1, keepdim=True)
        raw = torch.exp(torch.clamp(log_sum, -20.0, 20.0)).expand_as(log_ratio)
    raw = raw * mask
    if lower is None:
        w = raw.clamp(max=upper)
    else:
        w = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    if batch_normalize:
        if level == "token":
            mean = (w * mask).sum() / (mask.sum() + 1e-8)
        else:
            seq_w = (w * mask).sum(-1) / (mask.sum(-1) + 1e-8)
            seq_mask = (mask.sum(-1) > 0).to(w.dtype)
            mean = (seq_w * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8)
        if mean > 1e-8:
            w = w / mean
    return w


def gspo(old, logp, adv, mask, clip_low, clip_high):
    # compute_policy_loss_gspo with its forced "seq-mean-token-mean" (global_batch_size: the non-empty rows)
    neg_kl = logp - old
    seq = (neg_kl * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    log_s = torch.clamp(logp - logp.detach() + seq.detach().unsqueeze(-1), max=10.0)
    s = torch.exp(log_s)
    losses = torch.maximum(-adv * s, -adv * torch.clamp(s, 1 - clip_low, 1 + clip_high))
    return seq_mean_token_mean(losses, mask)


# --- core_algos.py at verl v0.9.0 (unchanged to 1dda039): GDPO, TIR-OTB, DRO, bypass mode ---

def grpo(scores, mask, index, eps=1e-6, norm_by_std=True):
    # compute_grpo_outcome_advantage on per-row scores
    out = scores.clone()
    for rows in _groups(index).values():
        group = torch.stack([scores[i] for i in rows])
        mean, std = (torch.tensor(0.0), torch.tensor(1.0)) if len(rows) == 1 else (group.mean(), group.std())
        for i in rows:
            out[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return out.unsqueeze(-1) * mask


def gdpo(score_list, mask, index, weights=None, eps=1e-6, norm_by_std=True):
    # compute_gdpo_outcome_advantage: GRPO per reward key, weighted sum, masked_whiten(...) * mask
    weights = torch.ones(len(score_list)) if weights is None else torch.tensor(weights, dtype=torch.float32)
    total = None
    for k, scores in enumerate(score_list):
        part = weights[k] * grpo(scores, mask, index, eps, norm_by_std)
        total = part if total is None else total + part
    return whiten(total, mask) * mask


def tir_optimal_token_baseline(rewards, mask, index, old_logprobs, sum_pi_squared, is_weights=None,
                               handle_zero_tail=True, eps=1e-8):
    # compute_multi_turn_optimal_token_baseline_advantage: rows packed to their valid tokens, loop for loop
    token_returns = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
    w = 1 - 2 * old_logprobs.exp() + sum_pi_squared
    if is_weights is not None:
        w = w * is_weights ** 2
    w_cum = (w * mask).cumsum(-1)
    lengths = mask.sum(-1).long()
    width = int(lengths.max())
    all_w, all_r = torch.zeros(len(lengths), width), torch.zeros(len(lengths), width)
    for i in range(len(lengths)):
        n = int(lengths[i])
        if n:
            all_w[i, :n], all_r[i, :n] = w_cum[i, mask[i].bool()], token_returns[i, mask[i].bool()]
    groups = defaultdict(list)
    for i in range(len(lengths)):
        if lengths[i]:
            groups[int(index[i])].append(i)
    baselines = torch.zeros_like(all_r)
    for rows in groups.values():
        idx = torch.tensor(rows)
        if len(rows) == 1:
            continue
        baselines[idx] = (all_r[idx] * all_w[idx]).sum(0) / (all_w[idx].sum(0) + eps)
        if handle_zero_tail:
            group_lengths = lengths[idx]
            ordered = torch.sort(group_lengths).values
            longest, second = int(ordered[-1]), int(ordered[-2])
            at_max = (group_lengths == longest).nonzero(as_tuple=True)[0]
            if at_max.numel() == 1 and longest > second:
                baselines[rows[int(at_max[0])], second:] = 0.0
    all_adv = all_r - baselines
    adv = torch.zeros_like(token_returns)
    for i in range(len(lengths)):
        if lengths[i]:
            adv[i, mask[i].bool()] = all_adv[i, :int(lengths[i])]
    return adv * mask, token_returns


def agg(loss, mask, mode, num_tokens=None, num_rows=None):
    # agg_loss with verl's global batch info (dp_size 1): batch_num_tokens / global_batch_size
    if mode == "token-mean":
        return (loss * mask).sum() / (mask.sum() if num_tokens is None else num_tokens)
    seq_mask = mask.sum(-1)
    rows = (seq_mask > 0).float()
    n = rows.sum() if num_rows is None else num_rows
    if mode == "seq-mean-token-mean":
        return ((loss * mask).sum(-1) / (seq_mask + 1e-8) * rows).sum() / n
    return ((loss * mask).sum(-1) * rows).sum() / n  # seq-mean-token-sum


def dro(old, logp, adv, mask, beta, mode="token-mean", rollout_is_weights=None):
    log_ratio = logp - old
    losses = -(logp * adv - 0.5 * beta * log_ratio.square())
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights
    return agg(losses, mask, mode)


def vanilla(old, logp, adv, mask, clip_low, clip_high, clip_c=3.0):
    # compute_policy_loss_vanilla's per-token losses (dual clip always on)
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    clipped1 = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high))
    return torch.where(adv < 0, torch.min(-adv * clip_c, clipped1), clipped1)


def bypass_mode(rollout, logp, adv, mask, loss_type, mode, rs_option=None, rs_upper=None, is_upper=2.0):
    # compute_policy_loss_bypass_mode: IS weights and rejection from the current logp against the rollout's
    # (no grad), the rejected mask passed to the loss, the global counts the unrejected mask's
    with torch.no_grad():
        log_ratio = logp.detach() - rollout
        weights = rollout_is_weights(log_ratio, mask, "token", is_upper)
        kept = mask if rs_option is None else rollout_rejection_mask(log_ratio, mask, rs_option, rs_upper)
    rows = (mask.sum(-1) > 0).float().sum()
    if loss_type == "reinforce":
        losses = -adv * logp * weights
    else:
        losses = vanilla(rollout, logp, adv, mask, 0.2, 0.2)
    return agg(losses, kept, mode, num_tokens=mask.sum(), num_rows=rows)


# --- verl/trainer/distillation at v0.9.0 (unchanged to 1dda039) ---

def forward_kl_topk(student_logits, teacher_topk_log_probs, teacher_topk_ids, log_prob_min_clamp=-10.0,
                    loss_max_clamp=10.0):
    # fsdp/losses.compute_forward_kl_topk (the log_softmax path) with kl_divergence, then losses.py's
    # compute_forward_kl_topk clamp_min(0) and distillation_loss's clamp to +-loss_max_clamp
    student_log_probs = torch.log_softmax(student_logits, dim=-1)
    student_topk = torch.gather(student_log_probs, dim=-1, index=teacher_topk_ids)
    student_topk = student_topk.clamp_min(log_prob_min_clamp)
    teacher = teacher_topk_log_probs.clamp_min(log_prob_min_clamp)
    losses = (teacher.exp() * (teacher.float() - student_topk.float())).sum(-1)
    return losses.clamp_min(0.0).clamp(min=-loss_max_clamp, max=loss_max_clamp)


def forward_kl_topk_renorm(student_logits, teacher_topk_log_probs, teacher_topk_ids, log_prob_min_clamp=-10.0,
                           loss_max_clamp=10.0):
    # verl main after 0.9, fsdp/losses.compute_forward_kl_topk_renorm (GKD's top-k form):
    #     student_log_probs_renorm = student_topk_log_probs_full - torch.logsumexp(
    #         student_topk_log_probs_full, dim=-1, keepdim=True)
    #     teacher_log_probs_renorm = teacher_topk_log_probs - torch.logsumexp(teacher_topk_log_probs, ...)
    # then the log_prob_min_clamp of both, kl_divergence, and the registered loss's clamp_min(0) and clamp
    student_full = torch.gather(torch.log_softmax(student_logits, dim=-1), dim=-1, index=teacher_topk_ids)
    student = student_full - torch.logsumexp(student_full, dim=-1, keepdim=True)
    teacher = teacher_topk_log_probs - torch.logsumexp(teacher_topk_log_probs, dim=-1, keepdim=True)
    student, teacher = student.clamp_min(log_prob_min_clamp), teacher.clamp_min(log_prob_min_clamp)
    losses = (teacher.float().exp() * (teacher.float() - student.float())).sum(-1)
    return losses.clamp_min(0.0).clamp(min=-loss_max_clamp, max=loss_max_clamp)


def distillation_estimator(student_logp, teacher_logp, mode, loss_max_clamp=10.0):
    # compute_distillation_loss_reverse_kl_estimator (kl_penalty(student, teacher, mode)) and the clamp
    log_ratio = student_logp - teacher_logp
    if mode in ("kl", "k1"):
        losses = log_ratio
    elif mode == "abs":
        losses = log_ratio.abs()
    elif mode in ("mse", "k2"):
        losses = 0.5 * log_ratio.square()
    else:  # low_var_kl / k3
        kl = torch.clamp(teacher_logp - student_logp, -20, 20)
        losses = torch.clamp(torch.exp(kl) - kl - 1, -10, 10)
    return losses.clamp(min=-loss_max_clamp, max=loss_max_clamp)
