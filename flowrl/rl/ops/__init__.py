"""Pure-torch RL ops, one module per stage: use them as `ops.advantages.grpo`.

- masked: masked_sum / masked_mean / masked_var / masked_whiten.
- aggregate: agg_loss / agg_weight over AGG_MODES.
- kl: kl_penalty estimators (k1, abs, k2, k3, and straight-through k1+, k3+, ...), adaptive_kl_coef.
- advantages: gae, grpo (norm_by_std=False: Dr.GRPO), rloo, reinforce_pp, remax, group_std, reinforce_pp_baseline, gpg, opo,
  grpo_passk, optimal_token_baseline, tir_optimal_token_baseline; gdpo: gdpo (per reward component).
- policy_loss: ppo_clip, gspo, cispo, dppo_tv, dppo_kl.
- policy_gradient: reinforce, gpg, sapo, gmpo, dro; cov_loss: clip_cov, kl_cov.
- value_loss: clipped_value_loss.
- rewards: token_rewards, overlong_penalty, kl_in_reward, pf_ppo_weights / pf_ppo_resample.
- rollout_correction: truncated_is_weights, rejection_keep_mask, mismatch_metrics
  (sampler vs trainer logprobs, after verl's rollout correction).
"""

from flowrl.rl.ops import (advantages, aggregate, cov_loss, gdpo, kl, masked, policy_gradient, policy_loss,
                           rewards, rollout_correction, value_loss)

__all__ = ["advantages", "aggregate", "cov_loss", "gdpo", "kl", "masked", "policy_gradient", "policy_loss",
           "rewards", "rollout_correction", "value_loss"]
