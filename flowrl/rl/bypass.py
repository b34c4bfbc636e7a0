"""verl's bypass mode: the sampler's logprobs stand in for the old policy's, so no old-logprob forward runs.

A graph runs `stages.rollout_as_old_logprobs` instead of `actor.logprobs`, and
updates with `bypass_loss(...)`. The rollout correction is then computed in
the loss from the current policy (rho = pi_current / pi_rollout, detached;
`RolloutCorrection(config, bypass=True)`), as verl's compute_policy_loss_bypass_mode:

- loss_type "ppo_clip": PPO's clipped loss (verl's vanilla, with its dual clip
  3.0) against the sampler's logprobs; the ratio already is pi / pi_rollout,
  so no IS weight multiplies it (verl computes them for metrics only; flowrl
  leaves them out), and rejection drops tokens or rows.
- loss_type "reinforce": -A * logp times the truncated IS weight
  min(pi / pi_rollout, is_threshold), rejected tokens dropped.

Rejected tokens count in the token and row counts, as verl's bypass mode
(its global batch info is the unrejected response mask's).
"""

from __future__ import annotations

from functools import partial
from typing import Literal

from flowrl.rl.correction import RolloutCorrection, RolloutCorrectionConfig
from flowrl.rl.loss_terms import policy_loss
from flowrl.rl.ops.policy_gradient import reinforce
from flowrl.rl.ops.policy_loss import ppo_clip

LossType = Literal["ppo_clip", "reinforce"]
IS_FIELDS = ("is_level", "is_threshold", "is_threshold_lower", "is_batch_normalize")  # off under ppo_clip
VERL_DUAL_CLIP = 3.0  # verl's clip_ratio_c default, always on in its vanilla loss


def bypass_loss(loss_type: LossType = "ppo_clip", correction: RolloutCorrection | None = None,
                clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = VERL_DUAL_CLIP,
                loss_agg_mode: str = "token-mean", kl_coef: float = 0.0) -> "Loss":
    """The bypass-mode policy loss; `correction` (default: token TIS at 2.0, verl's rollout_is default
    threshold) is used with bypass=True. ValueError naming loss_type for another value."""
    config = correction.config if correction is not None else RolloutCorrectionConfig(is_level="token")
    if loss_type == "ppo_clip":
        objective = partial(ppo_clip, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)
        off = RolloutCorrectionConfig.model_fields
        config = config.model_copy(update={name: off[name].default for name in IS_FIELDS})
    elif loss_type == "reinforce":
        objective = reinforce
    else:
        raise ValueError(f"loss_type must be 'ppo_clip' or 'reinforce', got {loss_type!r}")
    return policy_loss(objective, loss_agg_mode=loss_agg_mode, kl_coef=kl_coef,
                       rollout_correction=RolloutCorrection(config, bypass=True))


__all__ = ["LossType", "bypass_loss"]
