"""Supervised losses as LossFns (engines.protocols.LossFn): SFT's token NLL and reward models' Bradley-Terry.

`SFTLoss` is the negative log-likelihood of the tokens under `loss_mask` (the assistant's, built by the
`conversations` role), aggregated with `loss_agg_mode` (token-mean: verl's SFT trainer's mean over all
trained tokens) and combined over micro-batches by their count in that mode's unit, so a step's loss is
the whole mini-batch's however it is split.

`BradleyTerryLoss` trains a scalar-head model on preference pairs: each pair is two adjacent rows with
the same `group`, `preference` +1 on the chosen row and -1 on the rejected one; its score is the head's
output at the row's last response token, and the loss is mean over pairs of -log sigmoid(s_chosen -
s_rejected), plus `center_coef` times the mean squared score (reward centering, Eisenstein et al.,
arXiv:2312.09244: scores stay near 0). A pair's two rows must meet in one micro-batch (the
`learned_reward` role's update keeps them together). The stages below compute the same figures as evaluation metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from flowrl import metrics
from flowrl.graph.stage import stage
from flowrl.rl.loss_terms import Loss, NLLTerm
from flowrl.rl.ops.aggregate import AggMode


def token_nll(logprobs_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """-sum(logp * mask) / sum(mask); 0 for a mask with no token."""
    mask = mask_BT.to(logprobs_BT.dtype)
    return -(torch.where(mask_BT.bool(), logprobs_BT, 0) * mask).sum() / mask.sum().clamp(min=1)


def last_token(values_BR: torch.Tensor, response_mask_BR: torch.Tensor) -> torch.Tensor:
    """Each row's value at its last response token."""
    last_B = (response_mask_BR.sum(-1) - 1).clamp(min=0).long()
    return values_BR.gather(1, last_B.unsqueeze(-1)).squeeze(-1)


def pair_margins(scores_B: torch.Tensor, group_B: torch.Tensor, preference_B: torch.Tensor) -> torch.Tensor:
    """s_chosen - s_rejected per pair (pairs in order of group id); each group must hold one +1 and one -1 row."""
    groups, index_B = torch.unique(group_B, return_inverse=True)
    sign_B = preference_B.to(scores_B.dtype)
    counts = torch.zeros(len(groups), dtype=torch.long, device=scores_B.device).index_add_(
        0, index_B, torch.ones_like(index_B))
    signs = torch.zeros(len(groups), dtype=sign_B.dtype, device=scores_B.device).index_add_(0, index_B, sign_B)
    assert bool((counts == 2).all() and (signs == 0).all() and (sign_B.abs() == 1).all()), \
        "every pair needs its chosen (+1) and rejected (-1) row in the same micro-batch"
    return torch.zeros(len(groups), dtype=scores_B.dtype, device=scores_B.device).index_add(0, index_B,
                                                                                             scores_B * sign_B)


def bradley_terry(margins_P: torch.Tensor) -> torch.Tensor:
    """mean over pairs of -log sigmoid(margin) (softplus(-margin), stable for any margin)."""
    return F.softplus(-margins_P).mean()


class BuiltLoss:
    """A loss built from terms in `__post_init__` (its `loss` field): the LossFn protocol answered by that Loss
    (the losses here; the policy and value losses are plain Loss objects)."""

    loss: Loss

    @property
    def reads(self) -> tuple[str, ...]:
        return self.loss.reads

    @property
    def needs(self) -> tuple[str, ...]:
        return self.loss.needs

    @property
    def combine(self) -> Literal["mean", "sum"]:
        return self.loss.combine

    def __call__(self, out: dict[str, torch.Tensor], mb: TensorDict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.loss(out, mb)

    def weight(self, mb: TensorDict) -> float:
        return self.loss.weight(mb)


@dataclass(frozen=True)
class SFTLoss(BuiltLoss):
    """NLL over `loss_mask` (loss_terms.NLLTerm), aggregated with `loss_agg_mode`; metric "sft_loss"."""

    loss_agg_mode: AggMode = "token-mean"
    loss: Loss = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "loss", Loss((NLLTerm(),), self.loss_agg_mode))


@dataclass(frozen=True)
class BradleyTerryLoss:
    """Pairwise -log sigmoid(s_chosen - s_rejected), mean over pairs, + center_coef * mean(s^2); metrics
    "bt_loss" (the pairwise term), "accuracy", "margin"."""

    center_coef: float = 0.0

    def __post_init__(self) -> None:
        if not self.center_coef >= 0:
            raise ValueError(f"center_coef must be >= 0, got {self.center_coef}")

    @property
    def reads(self) -> tuple[str, ...]:
        return ("group", "preference")

    @property
    def needs(self) -> tuple[str, ...]:
        return ("scores",)

    @property
    def combine(self) -> Literal["mean", "sum"]:
        return "mean"

    def __call__(self, out: dict[str, torch.Tensor], mb: TensorDict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        scores_B = last_token(out["scores"], mb["response_mask"].to(out["scores"].device))
        margins = pair_margins(scores_B, mb["group"].to(scores_B.device), mb["preference"].to(scores_B.device))
        loss = bradley_terry(margins)
        total = loss + self.center_coef * scores_B.square().mean() if self.center_coef else loss
        return total, {"bt_loss": loss.detach(), "accuracy": (margins > 0).float().mean().detach(),
                      "margin": margins.mean().detach()}

    def weight(self, mb: TensorDict) -> float:
        return mb.batch_size[0] / 2


@stage(reads=("old_logprobs", "loss_mask"))
def nll_metrics(batch: TensorDict, metric: str = "eval/sft") -> TensorDict:
    """Logs `<metric>/loss`: the token-mean NLL of the batch's loss-mask tokens (their old logprobs)."""
    metrics.log(f"{metric}/loss", token_nll(batch["old_logprobs"], batch["loss_mask"]))
    metrics.log(f"{metric}/tokens", batch["loss_mask"].sum(-1).float().mean())
    return batch


@stage(reads=("rm_scores", "group", "preference"))
def preference_metrics(batch: TensorDict, metric: str = "eval/rm") -> TensorDict:
    """Logs `<metric>/accuracy` (pairs whose chosen response scores higher), `/loss` and `/margin`."""
    margins = pair_margins(batch["rm_scores"], batch["group"], batch["preference"])
    metrics.log(f"{metric}/accuracy", (margins > 0).float().mean())
    metrics.log(f"{metric}/loss", bradley_terry(margins))
    metrics.log(f"{metric}/margin", margins.mean())
    return batch
