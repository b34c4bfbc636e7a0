"""A loss is a sum of terms: `Loss((PolicyTerm(objective), KLTerm(0.001), EntropyTerm(0.01)))`.

Each term declares the batch fields it `reads` and the model outputs it `needs`
(flowrl.engines.train.model_outputs: "logprobs", "entropy", "values", ...) and gives a
per-token loss [B, T]. `Loss` aggregates every term with one `loss_agg_mode`
(ops.aggregate) and adds them, each times its `coef`; its `reads` and `needs` are
the terms' unions, so the train engine computes only the outputs some term asks
for, and the planner runs the reference policy only when a term reads
"ref_logprobs". Each term's aggregated value is logged under its `metric`, with
the term's own metrics beside it.

Rollout correction (flowrl.rl.correction) belongs to the loss, not to a term:
its truncated IS weights go to the terms that take them (`corrected`: the policy
objective), and its rejection is written into the loss mask every term reads
(as verl writes it into response_mask), so an objective's row and batch
statistics (GMPO's and GSPO's row means, Clip-Cov's and KL-Cov's covariance)
never see a rejected token, which gets no loss and no gradient. Terms are
registered by name in TERMS; a new one is a frozen dataclass with these five
members and a `__call__(out, mb, is_weights_BT)`.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, replace
from typing import Callable, ClassVar, Literal, Protocol

import torch
from tensordict import TensorDict

from flowrl.graph.registry import Registry
from flowrl.rl.correction import RolloutCorrection
from flowrl.rl.ops.aggregate import SUM_MODES, agg_loss, agg_weight, check_agg_mode
from flowrl.rl.ops.kl import check_kl_kind, kl_penalty
from flowrl.rl.ops.masked import valid_mask
from flowrl.rl.ops.value_loss import clipped_value_loss

Objective = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
VALUE_CLIP = 0.5  # the critic's value clip, verl's cliprange_value default
TermResult = tuple[torch.Tensor, dict[str, torch.Tensor]]


class Term(Protocol):
    metric: str  # the aggregated term's metric name ("pg_loss", "kl_loss", ...)
    coef: float  # its weight in the loss
    corrected: bool  # takes the rollout correction's IS weights
    reads: tuple[str, ...]
    needs: tuple[str, ...]

    def __call__(self, out: dict[str, torch.Tensor], mb: TensorDict,
                 is_weights_BT: torch.Tensor | None) -> TermResult: ...


TERMS: Registry[type] = Registry("loss term")


def takes_is_weights(objective: Objective) -> bool:
    """Whether the objective takes the rollout IS weights itself: its signature has `is_weights_BT`
    (ops.policy_gradient.gmpo, whose geometric mean needs them inside)."""
    return "is_weights_BT" in inspect.signature(objective).parameters


@TERMS.register("policy")
@dataclass(frozen=True)
class PolicyTerm:
    """A policy objective of ops.policy_loss / ops.policy_gradient / ops.cov_loss, options bound with
    functools.partial. The IS weights go into an objective that takes them (`is_weights_BT=`, GMPO's
    geometric mean: `takes_is_weights`) and multiply the per-token loss of any other.
    weights_in_objective: None (that default, right for every objective), or False to multiply GMPO's
    per-token loss as well (the arithmetic mean of the weights, not verl's)."""

    objective: Objective
    weights_in_objective: bool | None = None
    metric: ClassVar[str] = "pg_loss"
    coef: ClassVar[float] = 1.0
    corrected: ClassVar[bool] = True
    reads: ClassVar[tuple[str, ...]] = ("old_logprobs", "advantages", "loss_mask")
    needs: ClassVar[tuple[str, ...]] = ("logprobs",)

    def __post_init__(self) -> None:
        if not callable(self.objective):
            raise ValueError(f"objective must be a callable policy objective, got {self.objective!r}")
        if self.weights_in_objective and not takes_is_weights(self.objective):
            raise ValueError(f"weights_in_objective: {self.objective!r} takes no is_weights_BT")

    @property
    def inside(self) -> bool:
        """Whether the IS weights go into the objective."""
        takes = takes_is_weights(self.objective)
        return takes if self.weights_in_objective is None else self.weights_in_objective

    def __call__(self, out: dict[str, torch.Tensor], mb: TensorDict,
                 is_weights_BT: torch.Tensor | None) -> TermResult:
        inside = is_weights_BT is not None and self.inside
        weights_kw = {"is_weights_BT": is_weights_BT} if inside else {}
        obj_BT, metrics = self.objective(out["logprobs"], mb["old_logprobs"], mb["advantages"], mb["loss_mask"],
                                         **weights_kw)
        if is_weights_BT is not None and not inside:
            obj_BT = obj_BT * is_weights_BT
        return obj_BT, metrics


@TERMS.register("kl")
@dataclass(frozen=True)
class KLTerm:
    """coef * kl(logp, ref) with an ops.kl estimator (verl's use_kl_loss / kl_loss_type)."""

    coef: float
    kind: str = "k3"
    metric: ClassVar[str] = "kl_loss"
    corrected: ClassVar[bool] = False
    reads: ClassVar[tuple[str, ...]] = ("ref_logprobs", "loss_mask")
    needs: ClassVar[tuple[str, ...]] = ("logprobs",)

    def __post_init__(self) -> None:
        check_kl_kind(self.kind)
        if not self.coef > 0:
            raise ValueError(f"kl_coef must be > 0 for a KL term (leave the term out for none), got {self.coef}")

    def __call__(self, out: dict[str, torch.Tensor], mb: TensorDict, is_weights_BT: torch.Tensor | None) -> TermResult:
        logprobs_BT = out["logprobs"]
        valid_BT = valid_mask(mb["loss_mask"], logprobs_BT)  # zero padding first: no NaN reaches backward
        logp_BT = torch.where(valid_BT, logprobs_BT, 0)
        return kl_penalty(logp_BT, torch.where(valid_BT, mb["ref_logprobs"], 0), self.kind), {}


@TERMS.register("entropy")
@dataclass(frozen=True)
class EntropyTerm:
    """An entropy bonus: -bonus * entropy (the metric "entropy" is the aggregated entropy itself)."""

    bonus: float
    metric: ClassVar[str] = "entropy"
    corrected: ClassVar[bool] = False
    reads: ClassVar[tuple[str, ...]] = ("loss_mask",)
    needs: ClassVar[tuple[str, ...]] = ("entropy",)

    @property
    def coef(self) -> float:
        return -self.bonus

    def __call__(self, out: dict[str, torch.Tensor], mb: TensorDict, is_weights_BT: torch.Tensor | None) -> TermResult:
        return out["entropy"], {}


@TERMS.register("value")
@dataclass(frozen=True)
class ValueTerm:
    """The critic's clipped value loss: mb["values"] are the rollout's (old) values, out["values"] the
    critic's current ones; `clip` is how far a prediction may move before the clipped term takes over."""

    clip: float
    metric: ClassVar[str] = "vf_loss"
    coef: ClassVar[float] = 1.0
    corrected: ClassVar[bool] = False
    reads: ClassVar[tuple[str, ...]] = ("values", "returns", "loss_mask")
    needs: ClassVar[tuple[str, ...]] = ("values",)

    def __post_init__(self) -> None:
        if self.clip <= 0:
            raise ValueError(f"clip must be > 0, got {self.clip}")

    def __call__(self, out: dict[str, torch.Tensor], mb: TensorDict, is_weights_BT: torch.Tensor | None) -> TermResult:
        return clipped_value_loss(out["values"], mb["values"], mb["returns"], mb["loss_mask"], self.clip)


@TERMS.register("nll")
@dataclass(frozen=True)
class NLLTerm:
    """Supervised fine-tuning: the negative log-likelihood of the tokens under the loss mask."""

    metric: ClassVar[str] = "sft_loss"
    coef: ClassVar[float] = 1.0
    corrected: ClassVar[bool] = False
    reads: ClassVar[tuple[str, ...]] = ("loss_mask",)
    needs: ClassVar[tuple[str, ...]] = ("logprobs",)

    def __call__(self, out: dict[str, torch.Tensor], mb: TensorDict, is_weights_BT: torch.Tensor | None) -> TermResult:
        return -torch.where(mb["loss_mask"].bool(), out["logprobs"], 0), {}


def _check_norm_len(norm_len: int | None, loss_agg_mode: str) -> None:
    if norm_len is None:
        return
    if norm_len <= 0:
        raise ValueError(f"norm_len must be > 0 or None, got {norm_len}")
    if loss_agg_mode != "seq-mean-token-sum-norm":
        warnings.warn(f"norm_len={norm_len} has no effect with loss_agg_mode={loss_agg_mode!r}", stacklevel=4)


def _reject(mb: TensorDict, keep_BT: torch.Tensor) -> TensorDict:
    """A shallow copy of `mb` whose loss mask is 0 on rejected tokens (verl's modified response_mask)."""
    term_mb = mb.copy()
    term_mb["loss_mask"] = torch.where(keep_BT, mb["loss_mask"], 0)
    return term_mb


def _union(*groups: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for group in groups for name in group))


@dataclass(frozen=True)
class Loss:
    """sum over terms of coef * agg(term), each aggregated over the loss mask with `loss_agg_mode`
    (norm_len: the constant length of "seq-mean-token-sum-norm"; None = the micro-batch's T). A LossFn
    (engines.protocols): `combine` is "sum" for token-sum and "mean" otherwise, `weight(mb)` the micro-batch's
    count in the mode's unit (the loss mask's, rejected tokens included)."""

    terms: tuple[Term, ...]
    loss_agg_mode: str = "token-mean"
    norm_len: int | None = None
    rollout_correction: RolloutCorrection | None = None

    def __post_init__(self) -> None:
        check_agg_mode(self.loss_agg_mode)
        _check_norm_len(self.norm_len, self.loss_agg_mode)
        if not self.terms:
            raise ValueError("terms: a loss needs at least one term")
        metrics = [term.metric for term in self.terms]
        if len(set(metrics)) < len(metrics):
            raise ValueError(f"terms: two terms log the same metric ({metrics}); a loss has each term once")
        if self.rollout_correction is not None and not isinstance(self.rollout_correction, RolloutCorrection):
            raise ValueError(f"rollout_correction must be a RolloutCorrection or None, got {self.rollout_correction!r}")

    @property
    def reads(self) -> tuple[str, ...]:
        reads = _union(*(term.reads for term in self.terms), ("loss_mask",))
        correction = ("old_logprobs", "rollout_logprobs") if self.rollout_correction is not None else ()
        return _union(reads, correction)

    @property
    def needs(self) -> tuple[str, ...]:
        return _union(*(term.needs for term in self.terms))

    @property
    def combine(self) -> Literal["mean", "sum"]:
        return "sum" if self.loss_agg_mode in SUM_MODES else "mean"

    def __call__(self, out: dict[str, torch.Tensor], mb: TensorDict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask_BT = mb["loss_mask"]
        is_weights_BT, keep_BT, metrics = None, None, {}
        if self.rollout_correction is not None:
            correction = self.rollout_correction
            old_BT = out["logprobs"].detach() if correction.bypass else mb["old_logprobs"]
            is_weights_BT, keep_BT, metrics = correction(old_BT, mb["rollout_logprobs"], mask_BT)
        term_mb = mb if keep_BT is None else _reject(mb, keep_BT)
        total = None
        for term in self.terms:
            loss_BT, term_metrics = term(out, term_mb, is_weights_BT if term.corrected else None)
            if keep_BT is not None:  # rejected tokens add 0 but still count in the token and row counts
                loss_BT = torch.where(keep_BT, loss_BT, 0)
            value = agg_loss(loss_BT, mask_BT, self.loss_agg_mode, self.norm_len, keep_BT)
            part = value if term.coef == 1.0 else term.coef * value
            total = part if total is None else total + part
            metrics = {**term_metrics, **metrics, term.metric: value.detach()}
        return total, metrics

    def weight(self, mb: TensorDict) -> float:
        return agg_weight(mb["loss_mask"], self.loss_agg_mode)

    def __add__(self, other: Loss | Term) -> Loss:
        """This loss with `other`'s terms (a Term, or a Loss aggregated the same way) added, as optax chains
        transforms: `cfg.loss() + MyTerm(0.1)`. The aggregation and the rollout correction stay this loss's."""
        if not isinstance(other, Loss):
            return replace(self, terms=(*self.terms, other))
        if (other.loss_agg_mode, other.norm_len) != (self.loss_agg_mode, self.norm_len):
            raise ValueError(f"terms: a loss aggregated {other.loss_agg_mode!r} (norm_len={other.norm_len}) cannot "
                             f"join one aggregated {self.loss_agg_mode!r} (norm_len={self.norm_len})")
        if other.rollout_correction not in (None, self.rollout_correction):
            raise ValueError("rollout_correction: the added loss has a correction of its own; a loss has one")
        return replace(self, terms=(*self.terms, *other.terms),
                       rollout_correction=self.rollout_correction or other.rollout_correction)

    def term(self, metric: str) -> Term:
        """The term that logs `metric` ("pg_loss", "kl_loss", "entropy", "vf_loss", ...)."""
        found = [term for term in self.terms if term.metric == metric]
        if not found:
            raise KeyError(f"no term logs {metric!r}; the terms log {[term.metric for term in self.terms]}")
        return found[0]


def policy_loss(objective: Objective, *, loss_agg_mode: str = "token-mean", kl_coef: float = 0.0,
                kl_kind: str = "k3", entropy_coef: float = 0.0, norm_len: int | None = None,
                rollout_correction: RolloutCorrection | None = None, weights_in_objective: bool | None = None) -> Loss:
    """The usual policy loss, agg(objective) + kl_coef * agg(kl(logp, ref)) - entropy_coef * agg(entropy): the
    Loss of a PolicyTerm(objective, weights_in_objective), a KLTerm(kl_coef, kl_kind) when kl_coef > 0 (else
    "ref_logprobs" is not read) and an EntropyTerm when entropy_coef != 0 (else no entropy is computed).
    objective: an op of ops.policy_loss, ops.policy_gradient or ops.cov_loss, options bound with
    functools.partial. rollout_correction: see Loss (None: "rollout_logprobs" is not read; rejected tokens
    still count in the normaliser and in weight(mb), docs/algorithms.md). Metrics "pg_loss", "kl_loss",
    "entropy" (each term before its coefficient), the objective's own and "rollout/*"."""
    check_kl_kind(kl_kind)
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef == 0 and kl_kind != "k3":
        warnings.warn(f"kl_kind={kl_kind!r} has no effect with kl_coef=0", stacklevel=2)
    terms: tuple[Term, ...] = (PolicyTerm(objective, weights_in_objective),)
    terms += (KLTerm(kl_coef, kl_kind),) if kl_coef > 0 else ()
    terms += (EntropyTerm(entropy_coef),) if entropy_coef != 0 else ()
    return Loss(terms, loss_agg_mode, norm_len, rollout_correction)


def value_loss(clip: float = VALUE_CLIP, loss_agg_mode: str = "token-mean", norm_len: int | None = None) -> Loss:
    """The critic's clipped value loss (ValueTerm) aggregated with `loss_agg_mode`.

    mb["values"] are the rollout's (old) values and out["values"] the
    critic's current ones. clip: how far the prediction may move from the old
    value before the clipped term takes over. Metrics "vf_loss", "vf_clipfrac".
    """
    return Loss((ValueTerm(clip),), loss_agg_mode, norm_len)
