"""Graph stages over flowrl.rl.ops: advantages, reward shaping, group filters.

Each is a thin batch wrapper: the math lives in flowrl.rl.ops (pure torch, unit
tested); these declare which fields they read and write.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from flowrl import metrics
from flowrl.data.batch import keep_rows, response_lengths
from flowrl.rl.ops import advantages as adv_ops
from flowrl.rl.ops import gdpo as gdpo_ops
from flowrl.rl.ops import kl as kl_ops
from flowrl.rl.ops import rewards as reward_ops
from flowrl.graph.stage import stage


def _log_advantages(batch: TensorDict) -> TensorDict:
    mask = batch["response_mask"].bool()
    metrics.log("advantages/mean", batch["advantages"][mask].mean() if mask.any() else 0.0)
    return batch


@stage(reads=("scores", "group", "response_mask"), writes=("advantages",))
def group_advantage(batch: TensorDict, *, norm_by_std: bool = True, eps: float = 1e-6) -> TensorDict:
    """GRPO (norm_by_std=True) or Dr.GRPO (False): score minus the group mean."""
    batch["advantages"] = adv_ops.grpo(batch["scores"], batch["group"], batch["response_mask"],
                                       eps=eps, norm_by_std=norm_by_std)
    return _log_advantages(batch)


@stage(reads=("scores", "group", "response_mask"), writes=("advantages",))
def rloo_advantage(batch: TensorDict) -> TensorDict:
    """RLOO: each sample's baseline is the mean score of the other samples of its prompt."""
    batch["advantages"] = adv_ops.rloo(batch["scores"], batch["group"], batch["response_mask"])
    return _log_advantages(batch)


def _token_reward_reads(kl_coef: float = 0.0, **_: Any) -> tuple[str, ...]:
    base = ("scores", "response_mask")
    return base + ("old_logprobs", "ref_logprobs") if kl_coef > 0 else base


@stage(reads=_token_reward_reads, writes=("token_rewards",))
def token_rewards(batch: TensorDict, *, kl_coef: float = 0.0, kl_kind: str = "k1") -> TensorDict:
    """The score on each response's last token, minus kl_coef * KL(actor || ref) per token."""
    rewards = reward_ops.token_rewards(batch["scores"], batch["response_mask"])
    if kl_coef > 0:
        kl = kl_ops.kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], kl_kind) * batch["response_mask"]
        rewards = reward_ops.kl_in_reward(rewards, kl, kl_coef)
        metrics.log("reward/kl", (kl.sum(-1)).mean())
    batch["token_rewards"] = rewards
    return batch


@stage(reads=("token_rewards", "values", "response_mask"), writes=("advantages", "returns"))
def gae_advantage(batch: TensorDict, *, gamma: float = 1.0, lam: float = 1.0) -> TensorDict:
    """PPO's generalized advantage estimate from critic values."""
    batch["advantages"], batch["returns"] = adv_ops.gae(batch["token_rewards"], batch["values"],
                                                        batch["response_mask"], gamma=gamma, lam=lam)
    return _log_advantages(batch)


@stage(reads=("token_rewards", "response_mask"), writes=("advantages", "returns"))
def reinforce_pp_advantage(batch: TensorDict, *, gamma: float = 1.0) -> TensorDict:
    """REINFORCE++: whitened discounted returns, no critic."""
    batch["advantages"], batch["returns"] = adv_ops.reinforce_pp(batch["token_rewards"], batch["response_mask"],
                                                                 gamma=gamma)
    return _log_advantages(batch)


@stage(reads=("scores", "response_mask"), writes=("scores",))
def overlong_penalty(batch: TensorDict, *, max_len: int, buffer_len: int, factor: float = 1.0) -> TensorDict:
    """DAPO's soft overlong punishment added to the sequence score."""
    penalty = reward_ops.overlong_penalty(response_lengths(batch), max_len, buffer_len, factor)
    batch["scores"] = batch["scores"] + penalty
    metrics.log("reward/overlong_penalty", penalty.mean())
    return batch


@stage(reads=("scores", "group"), rows=True)
def drop_uniform_groups(batch: TensorDict, *, key: str = "scores") -> TensorDict:
    """DAPO dynamic sampling: drop groups whose samples all scored the same (no signal)."""
    std = adv_ops.group_std(batch[key], batch["group"])
    keep = std > 0
    metrics.log("sampling/kept_fraction", keep.float().mean())
    return keep_rows(batch, keep)


@stage(reads=("scores",), writes=("baseline_scores",))
def keep_as_baseline(batch: TensorDict) -> TensorDict:
    """ReMax: keep the greedy rollout's scores as `baseline_scores`; they ride along as rows repeat."""
    batch["baseline_scores"] = batch["scores"].clone()
    return batch


@stage(reads=("scores", "baseline_scores", "response_mask"), writes=("advantages", "returns"))
def remax_advantage(batch: TensorDict) -> TensorDict:
    """ReMax: each sample's score minus its prompt's greedy-rollout score (keep_as_baseline)."""
    batch["advantages"], batch["returns"] = adv_ops.remax(batch["scores"], batch["baseline_scores"],
                                                          batch["response_mask"])
    return _log_advantages(batch)


@stage(reads=("token_rewards", "group", "response_mask"), writes=("advantages", "returns"))
def reinforce_pp_baseline_advantage(batch: TensorDict) -> TensorDict:
    """REINFORCE++-baseline: each row's summed token rewards minus its group's mean, whitened over the batch."""
    mask = batch["response_mask"]
    scores = torch.where(mask.bool(), batch["token_rewards"], 0).sum(-1)
    batch["advantages"] = adv_ops.reinforce_pp_baseline(scores, batch["group"], mask)
    batch["returns"] = batch["advantages"].clone()
    return _log_advantages(batch)


@stage(reads=("scores", "group", "response_mask"), writes=("advantages",))
def gpg_advantage(batch: TensorDict, *, f_norm: float = 1.0) -> TensorDict:
    """GPG: score minus the group mean, scaled by rows / rows with a nonzero score."""
    batch["advantages"] = adv_ops.gpg(batch["scores"], batch["group"], batch["response_mask"], f_norm=f_norm)
    return _log_advantages(batch)


@stage(reads=("scores", "group", "response_mask"), writes=("advantages",))
def opo_advantage(batch: TensorDict) -> TensorDict:
    """OPO: score minus the group's length-weighted mean score."""
    batch["advantages"] = adv_ops.opo(batch["scores"], batch["group"], batch["response_mask"])
    return _log_advantages(batch)


@stage(reads=("scores", "group", "response_mask"), writes=("advantages",))
def passk_advantage(batch: TensorDict, *, norm_by_std: bool = True) -> TensorDict:
    """GRPO pass@k: only each group's best sample gets an advantage, best minus second best."""
    batch["advantages"] = adv_ops.grpo_passk(batch["scores"], batch["group"], batch["response_mask"],
                                             norm_by_std=norm_by_std)
    return _log_advantages(batch)


@stage(reads=("token_rewards", "group", "response_mask", "old_logprobs", "sum_pi_squared"),
       writes=("advantages", "returns"))
def otb_advantage(batch: TensorDict, *, handle_zero_tail: bool = True) -> TensorDict:
    """Optimal token baseline: return-to-go minus a per-group, per-step baseline weighted by the cumulative
    1 - 2 pi_t + sum pi^2 (actor.logprobs(batch, outputs=("sum_pi_squared",)) writes the last)."""
    batch["advantages"], batch["returns"] = adv_ops.optimal_token_baseline(
        batch["token_rewards"], batch["response_mask"], batch["group"], batch["old_logprobs"],
        batch["sum_pi_squared"], handle_zero_tail=handle_zero_tail)
    return _log_advantages(batch)


@stage(reads=("token_rewards", "response_mask", "group", "old_logprobs", "sum_pi_squared"),
       writes=("advantages", "returns"))
def tir_otb_advantage(batch: TensorDict, *, handle_zero_tail: bool = True) -> TensorDict:
    """otb_advantage for multi-turn rows: time counted in generated tokens, tool observations skipped."""
    batch["advantages"], batch["returns"] = adv_ops.tir_optimal_token_baseline(
        batch["token_rewards"], batch["response_mask"], batch["group"], batch["old_logprobs"],
        batch["sum_pi_squared"], handle_zero_tail=handle_zero_tail)
    return _log_advantages(batch)


@stage(reads=("scores", "group", "response_mask"), writes=("advantages",))
def gdpo_advantage(batch: TensorDict, *, weights: tuple[float, ...] | None = None,
                   norm_by_std: bool = True) -> TensorDict:
    """GDPO: GRPO per reward component (scores [B, K], or [B] for one), weighted, whitened over the batch."""
    batch["advantages"] = gdpo_ops.gdpo(batch["scores"], batch["group"], batch["response_mask"],
                                        None if weights is None else list(weights), norm_by_std=norm_by_std)
    return _log_advantages(batch)


@stage(reads=("rollout_logprobs",), writes=("old_logprobs",))
def rollout_as_old_logprobs(batch: TensorDict) -> TensorDict:
    """verl's bypass mode: the sampler's logprobs are the old policy's (no actor.logprobs forward);
    update with flowrl.rl.bypass.bypass_loss."""
    batch["old_logprobs"] = batch["rollout_logprobs"].clone()
    return batch


@stage(reads=("scores", "response_ids"), rows=True)
def pf_ppo_resample(batch: TensorDict, *, method: str = "pow", weight_pow: float = 2.0, seed: int = 0) -> TensorDict:
    """PF-PPO: the batch's rows redrawn with replacement, each in proportion to a weight of its score.

    The draw is seeded from `seed` and the batch's tokens, so a step draws the same rows whichever
    executor runs it, and after a resume."""
    ids = batch["response_ids"].long()
    content = int((ids * torch.arange(1, ids.shape[-1] + 1)).sum()) + int(ids.shape[0])
    generator = torch.Generator().manual_seed((seed * 1_000_003 + content) % 2**63)
    rows = reward_ops.pf_ppo_resample(batch["scores"], method, weight_pow, generator=generator)
    metrics.log("pf_ppo/unique_fraction", torch.unique(rows).numel() / max(rows.numel(), 1))
    return batch[rows]


__all__ = ["group_advantage", "rloo_advantage", "token_rewards", "gae_advantage", "reinforce_pp_advantage",
           "overlong_penalty", "drop_uniform_groups", "keep_as_baseline", "remax_advantage",
           "reinforce_pp_baseline_advantage", "gpg_advantage", "opo_advantage", "passk_advantage", "otb_advantage",
           "pf_ppo_resample", "rollout_as_old_logprobs", "tir_otb_advantage", "gdpo_advantage"]
