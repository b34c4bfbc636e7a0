"""The configs of GRPO and PPO, written once for the prebuilt algorithms and every variant of them.

    class MyGRPOConfig(GRPOConfig):  # GRPO's KL (0.001, so the reference runs), clip, group size, correction
        temperature_bonus: float = 0.1

A variant that includes these keeps each default where it is declared (GRPO's KL weight is
options.GRPOKL's), so it loses no KL term, no reference model and no option. Each config builds its
losses: `cfg.loss()` (and PPO's `cfg.value_loss()`); PPO's `cfg.token_rewards(batch, kl_ctrl)` puts the
KL in the rewards.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from flowrl.rl import losses
from flowrl.rl.options import GRPOKL, AdaptiveKLReward, GroupSampling, KLReward, Sampled


class GRPOConfig(losses.PPOClip, GroupSampling, GRPOKL):
    """GRPO (DeepSeekMath): group-normalized scores, a symmetric clip, a k3 KL-to-reference loss."""

    model_config = ConfigDict(extra="forbid")
    norm_by_std: bool = Field(True, description="Divide by the group's std; False gives Dr.GRPO.")


class ActorCriticConfig(losses.PPOClip, losses.ValueClip, Sampled, KLReward):
    """PPO's options without the adaptive KL controller: the clipped policy and value losses, a k1 KL penalty
    in the rewards, GAE's (PF-PPO's base)."""

    model_config = ConfigDict(extra="forbid")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")


class PPOConfig(ActorCriticConfig, AdaptiveKLReward):
    """PPO (Ouyang et al.): ActorCriticConfig whose KL weight may adapt (the kl_ctrl role)."""

    model_config = ConfigDict(extra="forbid")
