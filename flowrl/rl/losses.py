"""Loss objects the train engine evaluates per micro-batch (engines.protocols.LossFn).

`PolicyLoss` composes a policy objective from ops.policy_loss with a KL
penalty to the reference policy and an entropy bonus; named algorithms are
presets over it, not subclasses: GRPO is `clip_higher_loss(clip_low=0.2,
clip_high=0.2)`, PPO the same with one clip value, DAPO the clip-higher
default. Each term is aggregated with the same `loss_agg_mode`; `combine`
is "sum" for token-sum (the engine adds micro-batch losses) and "mean" for
the rest, where `weight(mb)` is the micro-batch's count in that mode's unit,
so the engine can combine micro-batches into the exact mini-batch loss. Every policy loss
takes `rollout_correction` (flowrl.rl.correction): verl's truncated IS and
rejection against the sampler's logprobs.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Literal

import torch
from tensordict import TensorDict

from flowrl.rl.correction import RolloutCorrection
from flowrl.rl.ops.aggregate import SUM_MODES, agg_loss, agg_weight, check_agg_mode
from flowrl.rl.ops.kl import check_kl_kind, kl_penalty
from flowrl.rl.ops.masked import valid_mask
from flowrl.rl.ops.cov_loss import clip_cov, kl_cov
from flowrl.rl.ops.policy_gradient import gmpo, gpg, reinforce, sapo
from flowrl.rl.ops.policy_loss import check_clip_args, check_ratio_cap, cispo, dppo_kl, dppo_tv, gspo, ppo_clip
from flowrl.rl.ops.value_loss import clipped_value_loss

Objective = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


def _combine(loss_agg_mode: str) -> Literal["mean", "sum"]:
    """How the train engine combines micro-batch losses in this mode (engines.protocols.LossFn.combine)."""
    return "sum" if loss_agg_mode in SUM_MODES else "mean"


def _check_norm_len(norm_len: int | None, loss_agg_mode: str) -> None:
    if norm_len is None:
        return
    if norm_len <= 0:
        raise ValueError(f"norm_len must be > 0 or None, got {norm_len}")
    if loss_agg_mode != "seq-mean-token-sum-norm":
        warnings.warn(f"norm_len={norm_len} has no effect with loss_agg_mode={loss_agg_mode!r}", stacklevel=3)


@dataclass(frozen=True)
class PolicyLoss:
    """agg(objective) + kl_coef * agg(kl(logp, ref)) - entropy_coef * agg(entropy).

    objective: a function of ops.policy_loss (ppo_clip, gspo, cispo, dppo_tv,
        dppo_kl), ops.policy_gradient (reinforce, gpg, sapo, gmpo) or
        ops.cov_loss (clip_cov, kl_cov), options bound with functools.partial.
    loss_agg_mode: one of ops.aggregate.AGG_MODES, used for every term.
    kl_coef: weight of the KL-to-reference loss (verl's use_kl_loss); 0 = off
        and "ref_logprobs" is not read.
    kl_kind: KL estimator of ops.kl (verl's kl_loss_type), "k3" by default.
    entropy_coef: weight of the entropy bonus; 0 = off and no entropy needed.
    norm_len: the constant length of "seq-mean-token-sum-norm" (the max
        response length); None = the micro-batch's T.
    rollout_correction: None = off and "rollout_logprobs" is not read. Set,
        the objective's per-token loss is multiplied by its truncated IS
        weights, and tokens it rejects contribute to no term; they still count
        in each mode's normaliser and in weight(mb), which stays the loss
        mask's count (see docs/algorithms.md, rollout correction).
    weights_in_objective: the objective takes the IS weights itself
        (`is_weights_BT=`, GMPO's geometric mean) instead of its per-token
        loss being multiplied by them.

    Metrics: "pg_loss", "kl_loss" (when kl_coef > 0), "entropy" (when
    entropy_coef != 0), each the aggregated term before its coefficient,
    plus the objective's own metrics and the correction's "rollout/*".
    """

    objective: Objective
    loss_agg_mode: str = "token-mean"
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    entropy_coef: float = 0.0
    norm_len: int | None = None
    rollout_correction: RolloutCorrection | None = None
    weights_in_objective: bool = False

    def __post_init__(self) -> None:
        if not callable(self.objective):
            raise ValueError(f"objective must be a callable policy objective, got {self.objective!r}")
        check_agg_mode(self.loss_agg_mode)
        check_kl_kind(self.kl_kind)
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_coef == 0 and self.kl_kind != "k3":
            warnings.warn(f"kl_kind={self.kl_kind!r} has no effect with kl_coef=0", stacklevel=3)
        _check_norm_len(self.norm_len, self.loss_agg_mode)
        if self.rollout_correction is not None and not isinstance(self.rollout_correction, RolloutCorrection):
            raise ValueError(f"rollout_correction must be a RolloutCorrection or None, got {self.rollout_correction!r}")

    @property
    def reads(self) -> tuple[str, ...]:
        base = ("old_logprobs", "advantages", "loss_mask")
        base += ("ref_logprobs",) if self.kl_coef > 0 else ()
        return base + ("rollout_logprobs",) if self.rollout_correction is not None else base

    @property
    def needs_entropy(self) -> bool:
        return self.entropy_coef != 0

    @property
    def combine(self) -> Literal["mean", "sum"]:
        return _combine(self.loss_agg_mode)

    def _agg(self, loss_BT: torch.Tensor, mask_BT: torch.Tensor, keep_BT: torch.Tensor | None = None) -> torch.Tensor:
        """agg_loss over the loss mask; tokens outside `keep_BT` (rejected) add 0 but still count."""
        if keep_BT is not None:
            loss_BT = torch.where(keep_BT, loss_BT, 0)
        return agg_loss(loss_BT, mask_BT, self.loss_agg_mode, self.norm_len)

    def _correct(self, mb: TensorDict,
                 mask_BT: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, dict[str, torch.Tensor]]:
        """(IS weights, keep mask, "rollout/*" metrics) of the rollout correction; (None, None, {}) when off."""
        if self.rollout_correction is None:
            return None, None, {}
        return self.rollout_correction(mb["old_logprobs"], mb["rollout_logprobs"], mask_BT)

    def _kl_BT(self, logprobs_BT: torch.Tensor, mb: TensorDict, mask_BT: torch.Tensor) -> torch.Tensor:
        valid_BT = valid_mask(mask_BT, logprobs_BT)  # zero padding first: no NaN reaches backward
        logp_BT = torch.where(valid_BT, logprobs_BT, 0)
        ref_BT = torch.where(valid_BT, mb["ref_logprobs"], 0)
        return kl_penalty(logp_BT, ref_BT, self.kl_kind)

    def __call__(self, out: dict[str, torch.Tensor], mb: TensorDict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask_BT, logprobs_BT = mb["loss_mask"], out["logprobs"]
        is_weights_BT, keep_BT, rollout_metrics = self._correct(mb, mask_BT)
        inside = is_weights_BT is not None and self.weights_in_objective
        weights_kw = {"is_weights_BT": is_weights_BT} if inside else {}
        obj_BT, metrics = self.objective(logprobs_BT, mb["old_logprobs"], mb["advantages"], mask_BT, **weights_kw)
        if is_weights_BT is not None and not inside:
            obj_BT = obj_BT * is_weights_BT
        pg_loss = self._agg(obj_BT, mask_BT, keep_BT)
        loss = pg_loss
        metrics = {**metrics, **rollout_metrics, "pg_loss": pg_loss.detach()}
        if self.kl_coef > 0:
            kl_loss = self._agg(self._kl_BT(logprobs_BT, mb, mask_BT), mask_BT, keep_BT)
            loss = loss + self.kl_coef * kl_loss
            metrics["kl_loss"] = kl_loss.detach()
        if self.needs_entropy:
            entropy = self._agg(out["entropy"], mask_BT, keep_BT)
            loss = loss - self.entropy_coef * entropy
            metrics["entropy"] = entropy.detach()
        return loss, metrics

    def weight(self, mb: TensorDict) -> float:
        return agg_weight(mb["loss_mask"], self.loss_agg_mode)


def clip_higher_loss(clip_low: float = 0.2, clip_high: float = 0.28, dual_clip: float | None = 3.0,
                     **kw: Any) -> PolicyLoss:
    """DAPO's decoupled clip (arXiv:2503.14476): ppo_clip with clip_high > clip_low.

    GRPO is clip_higher_loss(clip_low=0.2, clip_high=0.2). dual_clip=3.0 is
    verl's clip_ratio_c, which its vanilla loss always applies; None turns it
    off. `kw` goes to PolicyLoss (loss_agg_mode, kl_coef, ...).
    """
    check_clip_args(clip_low, clip_high, dual_clip)
    objective = partial(ppo_clip, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)
    return PolicyLoss(objective=objective, **kw)


def ppo_loss(clip: float = 0.2, dual_clip: float | None = 3.0, **kw: Any) -> PolicyLoss:
    """PPO's clipped surrogate with one clip range and dual clip (verl's "vanilla")."""
    return clip_higher_loss(clip_low=clip, clip_high=clip, dual_clip=dual_clip, **kw)


def gspo_loss(clip_low: float = 3e-4, clip_high: float = 4e-4,
              loss_agg_mode: str = "seq-mean-token-mean", **kw: Any) -> PolicyLoss:
    """GSPO (arXiv:2507.18071) with the paper's clip range and its sequence-level aggregation."""
    check_clip_args(clip_low, clip_high)
    objective = partial(gspo, clip_low=clip_low, clip_high=clip_high)
    return PolicyLoss(objective=objective, loss_agg_mode=loss_agg_mode, **kw)


def cispo_loss(clip_low: float = 10.0, clip_high: float = 0.2, **kw: Any) -> PolicyLoss:
    """CISPO (arXiv:2506.13585) with verl's example clips: no lower bound, upper 1.2."""
    check_clip_args(clip_low, clip_high)
    return PolicyLoss(objective=partial(cispo, clip_low=clip_low, clip_high=clip_high), **kw)


def _trust_region_loss(objective: Objective, clip_low: float, clip_high: float, ratio_cap: float,
                       **kw: Any) -> PolicyLoss:
    check_clip_args(clip_low, clip_high)
    check_ratio_cap(ratio_cap)
    return PolicyLoss(objective=partial(objective, clip_low=clip_low, clip_high=clip_high, ratio_cap=ratio_cap), **kw)


def dppo_tv_loss(clip_low: float = 0.15, clip_high: float = 0.15, ratio_cap: float = 20.0, **kw: Any) -> PolicyLoss:
    """DPPO-Binary-TV (arXiv:2602.04879): a probability-difference trust region, truncated IS.

    clip_low / clip_high bound q - p and p - q (not the ratio); ratio_cap is
    verl's clip_ratio_c for DPPO. `kw` goes to PolicyLoss.
    """
    return _trust_region_loss(dppo_tv, clip_low, clip_high, ratio_cap, **kw)


def dppo_kl_loss(clip_low: float = 0.15, clip_high: float = 0.15, ratio_cap: float = 20.0, **kw: Any) -> PolicyLoss:
    """DPPO-Binary-KL (arXiv:2602.04879): dppo_tv_loss with the binary KL as the divergence."""
    return _trust_region_loss(dppo_kl, clip_low, clip_high, ratio_cap, **kw)


def reinforce_loss(**kw: Any) -> PolicyLoss:
    """Plain REINFORCE, -A * logp (verl's compute_policy_loss_reinforce); `kw` goes to PolicyLoss."""
    return PolicyLoss(objective=reinforce, **kw)


def gpg_loss(**kw: Any) -> PolicyLoss:
    """GPG's loss (arXiv:2504.02546, verl's "gpg"): -A * logp, token-mean by default."""
    return PolicyLoss(objective=gpg, **kw)


def sapo_loss(tau_pos: float = 1.0, tau_neg: float = 1.05, loss_agg_mode: str = "seq-mean-token-mean",
              **kw: Any) -> PolicyLoss:
    """SAPO (arXiv:2511.20347): soft sigmoid gate, verl's temperatures and its seq-mean-token-mean."""
    sapo(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.ones(1), tau_pos=tau_pos, tau_neg=tau_neg)  # checks
    return PolicyLoss(objective=partial(sapo, tau_pos=tau_pos, tau_neg=tau_neg), loss_agg_mode=loss_agg_mode, **kw)


def gmpo_loss(clip_low: float = 0.4, clip_high: float = 0.4, loss_agg_mode: str = "seq-mean-token-mean",
              **kw: Any) -> PolicyLoss:
    """GMPO (arXiv:2507.20673): geometric mean of sign-clipped token ratios; seq-mean-token-mean is verl's
    mean over rows of each row's loss. Rollout IS weights go inside the geometric mean (verl's geo_mean)."""
    check_clip_args(clip_low, clip_high)
    return PolicyLoss(objective=partial(gmpo, clip_low=clip_low, clip_high=clip_high), loss_agg_mode=loss_agg_mode,
                      weights_in_objective=True, **kw)


def clip_cov_loss(clip_low: float = 0.2, clip_high: float = 0.2, cov_ratio: float = 2e-4, cov_lb: float = 1.0,
                  cov_ub: float = 5.0, **kw: Any) -> PolicyLoss:
    """Clip-Cov (arXiv:2505.22617) with verl's defaults: PPO clip, a few high-covariance tokens detached."""
    check_clip_args(clip_low, clip_high)
    if not cov_ratio > 0:
        raise ValueError(f"cov_ratio must be > 0, got {cov_ratio}")
    objective = partial(clip_cov, clip_low=clip_low, clip_high=clip_high, cov_ratio=cov_ratio, cov_lb=cov_lb,
                        cov_ub=cov_ub)
    return PolicyLoss(objective=objective, **kw)


def kl_cov_loss(kl_cov_ratio: float = 2e-4, cov_kl_coef: float = 0.1, **kw: Any) -> PolicyLoss:
    """KL-Cov (arXiv:2505.22617) with verl's defaults: unclipped surrogate, |log r| penalty (verl's
    ppo_kl_coef, here cov_kl_coef) on the top-covariance tokens."""
    if not kl_cov_ratio > 0 or cov_kl_coef < 0:
        raise ValueError(f"kl_cov_ratio must be > 0 and cov_kl_coef >= 0, got {kl_cov_ratio} and {cov_kl_coef}")
    return PolicyLoss(objective=partial(kl_cov, kl_cov_ratio=kl_cov_ratio, kl_coef=cov_kl_coef), **kw)


@dataclass(frozen=True)
class ValueLoss:
    """The critic's clipped value loss, aggregated with `loss_agg_mode`.

    mb["values"] are the rollout's (old) values and out["values"] the
    critic's current ones. clip: how far the prediction may move from the old
    value before the clipped term takes over. Metrics "vf_loss", "vf_clipfrac".
    """

    clip: float = 0.5
    loss_agg_mode: str = "token-mean"
    norm_len: int | None = None

    def __post_init__(self) -> None:
        if self.clip <= 0:
            raise ValueError(f"clip must be > 0, got {self.clip}")
        check_agg_mode(self.loss_agg_mode)
        _check_norm_len(self.norm_len, self.loss_agg_mode)

    @property
    def reads(self) -> tuple[str, ...]:
        return ("values", "returns", "loss_mask")

    @property
    def needs_entropy(self) -> bool:
        return False

    @property
    def combine(self) -> Literal["mean", "sum"]:
        return _combine(self.loss_agg_mode)

    def __call__(self, out: dict[str, torch.Tensor], mb: TensorDict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask_BT = mb["loss_mask"]
        loss_BT, metrics = clipped_value_loss(out["values"], mb["values"], mb["returns"], mask_BT, self.clip)
        vf_loss = agg_loss(loss_BT, mask_BT, self.loss_agg_mode, self.norm_len)
        return vf_loss, {"vf_loss": vf_loss.detach(), **metrics}

    def weight(self, mb: TensorDict) -> float:
        return agg_weight(mb["loss_mask"], self.loss_agg_mode)
