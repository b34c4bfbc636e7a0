"""Named policy losses: presets over the terms of flowrl.rl.loss_terms, like optax's adamw over chain().

A preset (`PPOClip`, `ClipHigher`, `GSPOClip`, ...) is a pydantic config of one
policy objective's options (ops.policy_loss, ops.policy_gradient, ops.cov_loss)
plus the aggregation and the entropy bonus. An algorithm's config includes its
preset as a base class beside its parts (flowrl.rl.options), so each default is
written once, here, and `cfg.loss()` is the algorithm's whole policy loss, a
`Loss` (objective term, the KL term of a KLLoss part when kl_coef > 0, entropy
term when entropy_coef != 0, the rollout correction of a Sampled part), that
composes: `cfg.loss() + MyTerm(0.1)`. Named algorithms are presets, not
subclasses: GRPO's loss is PPOClip with a KL term, DAPO's ClipHigher (PPOClip
with clip_high > clip_low). `ppo_loss(...)`, `gspo_loss(...)`, ... build a
preset's loss from keyword options. docs/algorithms.md tabulates every prebuilt
algorithm's effective loss (tests/test_docs_losses.py checks it).
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field

from flowrl.rl.loss_terms import VALUE_CLIP, Loss, Objective, policy_loss, value_loss
from flowrl.rl.ops.aggregate import AggMode
from flowrl.rl.ops.cov_loss import clip_cov, kl_cov
from flowrl.rl.ops.policy_gradient import gmpo, gpg, reinforce, sapo
from flowrl.rl.ops.policy_loss import cispo, dppo_kl, dppo_tv, gspo, ppo_clip
from flowrl.rl.options import LossPart

__all__ = ["Loss", "LossPreset", "PRESETS", "policy_loss", "value_loss"]

# Options whose bound and description are written once; an algorithm whose default differs states only the value
# on the type (`dual_clip: DualClip = None`), as flowrl.rl.options does for the shared options.
LossAggMode = Annotated[AggMode, Field(description="How token losses are aggregated (flowrl.rl.ops.aggregate).")]
DualClip = Annotated[float | None, Field(gt=1, description="Dual-clip bound for negative advantages; None is off.")]
RatioCap = Annotated[float, Field(ge=1, description="Truncation of the detached IS ratio (verl's clip_ratio_c).")]
VERL_CLIP_RATIO_C = 3.0  # verl's default dual clip (clip_ratio_c), which its vanilla loss always applies


class LossPreset(LossPart):
    """A named policy loss's options: `cfg.loss()` binds them to the preset's objective (an op of ops.*) and
    adds every other part's `loss_options()` (policy_loss's kl_coef, rollout_correction). An algorithm's config
    includes its preset as a base class, so the preset's options are the algorithm's `algo.*` keys and each
    default is written here once. A default that differs from the op's own (its signature's, a bare formula's)
    is listed in `differs_from_op` with the reason."""

    model_config = ConfigDict(extra="forbid")
    objective: ClassVar[Objective]
    weights_in_objective: ClassVar[bool] = False
    differs_from_op: ClassVar[dict[str, str]] = {}
    loss_agg_mode: LossAggMode = "token-mean"
    entropy_coef: float = Field(0.0, description="Entropy bonus weight; 0 computes no entropy.")

    @classmethod
    def preset(cls) -> type[LossPreset]:
        """The preset class itself: the nearest class of the MRO that declares the objective (an algorithm's
        config that includes the preset, or a preset that only changes defaults, has the same options)."""
        return next(base for base in cls.__mro__ if "objective" in vars(base))

    @classmethod
    def objective_options(cls, cfg: LossPreset) -> dict[str, Any]:
        """The op's keyword arguments: by default the preset's own fields, under their names."""
        return {name: getattr(cfg, name) for name in cls.preset().model_fields if name not in LossPreset.model_fields}

    @classmethod
    def bound_objective(cls, cfg: LossPreset) -> Objective:
        options = cls.objective_options(cfg)
        return partial(cls.objective, **options) if options else cls.objective

    def loss_options(self) -> dict[str, Any]:
        return {**super().loss_options(), "loss_agg_mode": self.loss_agg_mode, "entropy_coef": self.entropy_coef,
                "weights_in_objective": self.weights_in_objective}

    def loss(self) -> Loss:
        """The algorithm's policy loss from every option its config holds."""
        return policy_loss(self.bound_objective(self), **self.loss_options())

    @classmethod
    def from_options(cls, **options: Any) -> Loss:
        """The preset's Loss from keyword options: its own fields, then policy_loss's."""
        own = {name: options.pop(name) for name in list(options) if name in cls.model_fields}
        preset = cls(**own)
        return policy_loss(cls.bound_objective(preset), **{**preset.loss_options(), **options})


class PPOClip(LossPreset):
    """PPO's clipped surrogate with one clip range and dual clip (verl's "vanilla"); GRPO's too."""

    objective: ClassVar[Objective] = ppo_clip
    differs_from_op: ClassVar[dict[str, str]] = {"dual_clip": "verl's clip_ratio_c, which its vanilla loss "
                                                               "always applies"}
    clip: float = Field(0.2, gt=0, lt=1, description="PPO clip range, the same on both sides.")
    dual_clip: DualClip = VERL_CLIP_RATIO_C

    @classmethod
    def objective_options(cls, cfg: LossPreset) -> dict[str, Any]:
        return {"clip_low": cfg.clip, "clip_high": cfg.clip, "dual_clip": cfg.dual_clip}


class DrGRPO(PPOClip):
    """Dr. GRPO (arXiv:2503.20783): GRPO's clip without the per-response length normalisation, each row's
    token losses summed over a constant length (pass the longest response as policy_loss's `norm_len`)."""

    loss_agg_mode: LossAggMode = "seq-mean-token-sum-norm"


class ClipHigher(LossPreset):
    """DAPO's decoupled clip (arXiv:2503.14476): ppo_clip with clip_high > clip_low."""

    objective: ClassVar[Objective] = ppo_clip
    differs_from_op: ClassVar[dict[str, str]] = {"clip_high": "DAPO's clip-higher", **PPOClip.differs_from_op}
    clip_low: float = Field(0.2, gt=0, lt=1, description="Lower clip range (ratio >= 1 - clip_low).")
    clip_high: float = Field(0.28, gt=0, description="Upper clip range (ratio <= 1 + clip_high).")
    dual_clip: DualClip = VERL_CLIP_RATIO_C


class GSPOClip(LossPreset):
    """GSPO (arXiv:2507.18071) with the paper's clip range and its sequence-level aggregation."""

    objective: ClassVar[Objective] = gspo
    loss_agg_mode: LossAggMode = "seq-mean-token-mean"
    clip_low: float = Field(3e-4, gt=0, lt=1, description="Lower clip of the sequence ratio (s >= 1 - clip_low).")
    clip_high: float = Field(4e-4, gt=0, lt=1, description="Upper clip of the sequence ratio (s <= 1 + clip_high).")


class CISPOClip(LossPreset):
    """CISPO (arXiv:2506.13585) with verl's example clips: no lower bound, upper 1.2."""

    objective: ClassVar[Objective] = cispo
    clip_low: float = Field(10.0, ge=0, description="Lower clip of the IS weight (w >= 1 - clip_low); "
                                                    "10 is no lower bound.")
    clip_high: float = Field(0.2, ge=0, description="Upper clip of the IS weight (w <= 1 + clip_high).")


class TrustRegion(LossPreset):
    """DPPO (arXiv:2602.04879): a binary-TV or binary-KL trust region on the sampled token, truncated IS."""

    objective: ClassVar[Objective] = dppo_tv
    divergence: Literal["tv", "kl"] = Field("tv", description="Trust-region divergence of the sampled token: "
                                                              "'tv' (p - q) or 'kl' (binary KL).")
    clip_low: float = Field(0.15, ge=0, le=1, description="Divergence bound for tokens with A <= 0.")
    clip_high: float = Field(0.15, ge=0, le=1, description="Divergence bound for tokens with A > 0.")
    ratio_cap: RatioCap = 20.0  # the op's (verl's function's fallback); the dppo algorithm uses 3.0

    @classmethod
    def objective_options(cls, cfg: LossPreset) -> dict[str, Any]:
        return {"clip_low": cfg.clip_low, "clip_high": cfg.clip_high, "ratio_cap": cfg.ratio_cap}

    @classmethod
    def bound_objective(cls, cfg: LossPreset) -> Objective:
        return partial(dppo_tv if cfg.divergence == "tv" else dppo_kl, **cls.objective_options(cfg))


class Reinforce(LossPreset):
    """Plain REINFORCE, -A * logp (verl's compute_policy_loss_reinforce)."""

    objective: ClassVar[Objective] = reinforce


class GPG(LossPreset):
    """GPG's loss (arXiv:2504.02546, verl's "gpg"): -A * logp."""

    objective: ClassVar[Objective] = gpg


class SAPOGate(LossPreset):
    """SAPO (arXiv:2511.20347): soft sigmoid gate, verl's temperatures and its seq-mean-token-mean."""

    objective: ClassVar[Objective] = sapo
    loss_agg_mode: LossAggMode = "seq-mean-token-mean"
    tau_pos: float = Field(1.0, gt=0, description="Gate temperature for tokens with A > 0.")
    tau_neg: float = Field(1.05, gt=0, description="Gate temperature for tokens with A <= 0 (sharper: > tau_pos).")


class GeometricMean(LossPreset):
    """GMPO (arXiv:2507.20673): geometric mean of sign-clipped token ratios per row (seq-mean-token-mean is
    verl's mean over rows of each row's loss); rollout IS weights go inside the mean (verl's geo_mean)."""

    objective: ClassVar[Objective] = gmpo
    weights_in_objective: ClassVar[bool] = True
    loss_agg_mode: LossAggMode = "seq-mean-token-mean"
    clip_low: float = Field(0.4, gt=0, description="Lower clip of each token's log-ratio (l >= -clip_low).")
    clip_high: float = Field(0.4, gt=0, description="Upper clip of each token's log-ratio (l <= clip_high).")


class ClipCov(LossPreset):
    """Clip-Cov (arXiv:2505.22617) with verl's defaults: PPO clip, a few high-covariance tokens detached."""

    objective: ClassVar[Objective] = clip_cov
    clip: float = Field(0.2, gt=0, lt=1, description="PPO clip range, the same on both sides.")
    cov_ratio: float = Field(2e-4, gt=0, le=1, description="Share of valid tokens whose gradient is dropped.")
    cov_lb: float = Field(1.0, description="Only tokens with covariance above this are candidates.")
    cov_ub: float = Field(5.0, description="Only tokens with covariance below this are candidates.")

    @classmethod
    def objective_options(cls, cfg: LossPreset) -> dict[str, Any]:
        return {"clip_low": cfg.clip, "clip_high": cfg.clip, "cov_ratio": cfg.cov_ratio, "cov_lb": cfg.cov_lb,
                "cov_ub": cfg.cov_ub}


class KLCov(LossPreset):
    """KL-Cov (arXiv:2505.22617) with verl's defaults: unclipped surrogate, |log r| penalty (verl's
    ppo_kl_coef, here cov_kl_coef) on the top-covariance tokens."""

    objective: ClassVar[Objective] = kl_cov
    kl_cov_ratio: float = Field(2e-4, gt=0, le=1, description="Share of valid tokens that get the penalty.")
    cov_kl_coef: float = Field(0.1, ge=0, description="Weight of their |log r| penalty (verl's ppo_kl_coef).")

    @classmethod
    def objective_options(cls, cfg: LossPreset) -> dict[str, Any]:
        return {"kl_cov_ratio": cfg.kl_cov_ratio, "kl_coef": cfg.cov_kl_coef}


class ValueClip(LossPart):
    """The critic's clipped value loss (PPO, PF-PPO): `cfg.value_loss()`."""

    model_config = ConfigDict(extra="forbid")
    value_clip: float = Field(VALUE_CLIP, gt=0, description="Value-function clip range.")

    def value_loss(self) -> Loss:
        return value_loss(clip=self.value_clip)


PRESETS: tuple[type[LossPreset], ...] = (PPOClip, DrGRPO, ClipHigher, GSPOClip, CISPOClip, TrustRegion, Reinforce,
                                         GPG, SAPOGate, GeometricMean, ClipCov, KLCov)


def ppo_loss(**options: Any) -> Loss:
    """PPOClip's loss; `options`: its fields (clip, dual_clip, loss_agg_mode, entropy_coef), then policy_loss's."""
    return PPOClip.from_options(**options)


def dr_grpo_loss(**options: Any) -> Loss:
    """Dr. GRPO's loss: ppo_loss() aggregated "seq-mean-token-sum-norm"; its advantages are GRPO's without the
    std (stages.group_advantage(norm_by_std=False))."""
    return DrGRPO.from_options(**options)


def clip_higher_loss(**options: Any) -> Loss:
    """ClipHigher's (DAPO's) loss; clip_higher_loss(clip_low=0.2, clip_high=0.2) is ppo_loss(), GRPO's."""
    return ClipHigher.from_options(**options)


def gspo_loss(**options: Any) -> Loss:
    return GSPOClip.from_options(**options)


def cispo_loss(**options: Any) -> Loss:
    return CISPOClip.from_options(**options)


def dppo_tv_loss(**options: Any) -> Loss:
    """DPPO-Binary-TV: clip_low / clip_high bound q - p and p - q (not the ratio)."""
    return TrustRegion.from_options(divergence="tv", **options)


def dppo_kl_loss(**options: Any) -> Loss:
    """DPPO-Binary-KL: dppo_tv_loss with the binary KL as the divergence."""
    return TrustRegion.from_options(divergence="kl", **options)


def reinforce_loss(**options: Any) -> Loss:
    return Reinforce.from_options(**options)


def gpg_loss(**options: Any) -> Loss:
    return GPG.from_options(**options)


def sapo_loss(**options: Any) -> Loss:
    return SAPOGate.from_options(**options)


def gmpo_loss(**options: Any) -> Loss:
    return GeometricMean.from_options(**options)


def clip_cov_loss(**options: Any) -> Loss:
    return ClipCov.from_options(**options)


def kl_cov_loss(**options: Any) -> Loss:
    return KLCov.from_options(**options)
