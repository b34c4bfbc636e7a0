"""Pure-torch RL ops, one module per stage: use them as `ops.advantages.grpo`.

- masked: masked_sum / masked_mean / masked_var / masked_whiten.
- aggregate: agg_loss / agg_weight over AGG_MODES.
- kl: kl_penalty estimators (k1, abs, k2, k3).
- advantages: gae, grpo, dr_grpo, rloo, reinforce_pp, remax, group_std.
- policy_loss: ppo_clip, gspo, cispo, entropy_from_logits.
- value_loss: clipped_value_loss.
- rewards: token_rewards, overlong_penalty, kl_in_reward.
- rollout_correction: truncated_is_weights, rejection_keep_mask, mismatch_metrics
  (sampler vs trainer logprobs, after verl's rollout correction).
"""

from flowrl.rl.ops import advantages, aggregate, kl, masked, policy_loss, rewards, rollout_correction, value_loss

__all__ = ["advantages", "aggregate", "kl", "masked", "policy_loss", "rewards", "rollout_correction", "value_loss"]
