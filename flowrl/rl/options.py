"""Options many algorithms share, each declared once: small configs ("parts") an algorithm's config includes
beside its loss preset (flowrl.rl.losses), as optax's presets share their transforms.

    class GRPOConfig(losses.PPOClip, GroupSampling, KLLoss):
        kl_coef: KLLossCoef = 0.001  # GRPO's own default; the bound and the description stay KLLossCoef's

A part says what its options do, so the algorithm wires nothing by hand: `cfg.loss()` (losses.LossPreset.loss)
collects every part's `loss_options()` (KLLoss: a k3 KL term; Sampled: the rollout correction), and KLReward's
`cfg.token_rewards(batch)` puts its k1 penalty in the token rewards instead. The options keep their flat keys
(`algo.group_size=4`, `algo.kl_coef=0`, `algo.rollout_correction.is_level=token`). An algorithm whose default
differs states only the value, on the option's type (`group_size: GroupSize = 4`), so the bounds and the
description are still written once, here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from flowrl.rl import stages
from flowrl.rl.correction import RolloutCorrectionConfig

GroupSize = Annotated[int, Field(ge=2, description="Responses sampled per prompt.")]
KLLossCoef = Annotated[float, Field(ge=0, description="Weight of the k3 KL-to-reference loss; 0 drops the ref "
                                                      "role.")]
KLRewardCoef = Annotated[float, Field(ge=0, description="Weight of the k1 KL-to-reference penalty in the token "
                                                        "rewards (verl's use_kl_in_reward); 0 drops the ref role.")]
GRPO_KL_COEF = 0.001  # GRPO's KL-loss weight (verl's GRPO examples' kl_loss_coef)


class LossPart(BaseModel):
    """A part of an algorithm's config: `loss_options()` are its keywords of the policy loss
    (loss_terms.policy_loss), each part adding its own to its bases' (cooperative, through the MRO)."""

    def loss_options(self) -> dict[str, Any]:
        return {}


class Sampled(LossPart):
    """An algorithm learning from sampled responses: it may correct for the sampler's logprobs."""

    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig,
                                                        description="Truncated IS / rejection against the "
                                                                    "sampler's logprobs (verl's rollout correction).")

    def loss_options(self) -> dict[str, Any]:
        return {**super().loss_options(), "rollout_correction": self.rollout_correction.build()}


class GroupSampling(Sampled):
    """Several responses per prompt, scored against each other (GRPO and its relatives)."""

    group_size: GroupSize = 8


class KLLoss(LossPart):
    """KL to the reference policy as a k3 term of the loss (off by default: most critic-free papers drop it;
    GRPOKL is GRPO's weight)."""

    kl_coef: KLLossCoef = 0.0

    def loss_options(self) -> dict[str, Any]:
        return {**super().loss_options(), "kl_coef": self.kl_coef}


class GRPOKL(KLLoss):
    """GRPO's KL loss: KLLoss at GRPO's weight, written once for GRPO and every variant of it."""

    kl_coef: KLLossCoef = GRPO_KL_COEF


class KLReward(LossPart):
    """KL to the reference policy as a k1 penalty in the token rewards (PPO, REINFORCE++), not in the loss."""

    kl_coef: KLRewardCoef = 0.001

    def token_rewards(self, batch: Any, kl_ctrl: Any = None) -> Any:
        """The score on each response's last token minus kl_coef * k1 KL per token (stages.token_rewards)."""
        return stages.token_rewards(batch, kl_coef=self.kl_coef, kl_kind="k1")


class AdaptiveKLReward(KLReward):
    """KLReward whose weight may move toward a target KL each step (verl's kl_ctrl; the kl_ctrl role)."""

    kl_ctrl: Literal["fixed", "adaptive"] = Field("fixed", description="'adaptive' moves the KL weight, from kl_coef, "
                                                  "toward target_kl each step (verl's kl_ctrl.type).")
    target_kl: float = Field(0.1, gt=0, description="The adaptive controller's target KL per token.")
    horizon: int = Field(10000, gt=0, description="The adaptive controller's horizon, in rows (verl's kl_ctrl).")

    @model_validator(mode="after")
    def _adaptive_needs_a_weight(self) -> "AdaptiveKLReward":
        if self.kl_ctrl == "adaptive" and self.kl_coef == 0:
            raise ValueError("kl_ctrl: 'adaptive' scales kl_coef, which is 0; set kl_coef > 0")
        return self

    def token_rewards(self, batch: Any, kl_ctrl: Any = None) -> Any:
        """KLReward's, or with kl_ctrl='adaptive' the kl_ctrl role's, whose weight starts at kl_coef."""
        if self.kl_ctrl == "fixed":
            return super().token_rewards(batch)
        if kl_ctrl is None:
            raise ValueError("algo.kl_ctrl: 'adaptive' needs the kl_ctrl role; the algorithm passes none")
        return kl_ctrl.token_rewards(batch, init_coef=self.kl_coef, target_kl=self.target_kl, horizon=self.horizon)

