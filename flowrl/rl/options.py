"""Options many algorithms share, each declared once: small configs an algorithm's config includes beside its
loss preset (flowrl.rl.losses), as optax's presets share their transforms.

    class GRPOConfig(losses.PPOClip, GroupSampling, KLLoss):
        kl_coef: KLLossCoef = 0.001  # GRPO's own default; the bound and the description stay KLLossCoef's

The options keep their flat keys (`algo.group_size=4`, `algo.kl_coef=0`, `algo.rollout_correction.is_level=token`).
An algorithm whose default differs states only the value, on the option's type (`group_size: GroupSize = 4`),
so the bounds and the description are still written once, here.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from flowrl.rl.correction import RolloutCorrectionConfig

GroupSize = Annotated[int, Field(ge=2, description="Responses sampled per prompt.")]
KLLossCoef = Annotated[float, Field(ge=0, description="Weight of the k3 KL-to-reference loss; 0 drops the ref "
                                                      "role.")]
KLRewardCoef = Annotated[float, Field(ge=0, description="Weight of the k1 KL-to-reference penalty in the token "
                                                        "rewards (verl's use_kl_in_reward); 0 drops the ref role.")]


class Sampled(BaseModel):
    """An algorithm learning from sampled responses: it may correct for the sampler's logprobs."""

    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig,
                                                        description="Truncated IS / rejection against the "
                                                                    "sampler's logprobs (verl's rollout correction).")


class GroupSampling(Sampled):
    """Several responses per prompt, scored against each other (GRPO and its relatives)."""

    group_size: GroupSize = 8


class KLLoss(BaseModel):
    """KL to the reference policy as a term of the loss (off by default: most critic-free papers drop it)."""

    kl_coef: KLLossCoef = 0.0


class KLReward(BaseModel):
    """KL to the reference policy as a penalty in the token rewards (PPO, REINFORCE++)."""

    kl_coef: KLRewardCoef = 0.001
