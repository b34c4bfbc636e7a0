"""Rollout correction as an option of every policy loss (verl's decoupled rollout correction).

`RolloutCorrection` is what `policy_loss(rollout_correction=...)` evaluates per
micro-batch from the trainer's old logprobs and the sampler's
`rollout_logprobs` (ops.rollout_correction): truncated IS weights that multiply
the policy-gradient loss, a rejection mask that drops tokens or whole rows,
and the mismatch metrics. `RolloutCorrectionConfig` is the algorithms' nested
`algo.rollout_correction.*` options; `build()` gives the loss option, or None
when everything is off.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flowrl.rl.ops import rollout_correction as rc

Level = Literal["token", "sequence", "geometric"]
PREFIX = "rollout/"  # metric names; the actor logs them as actor/rollout/<name>


@dataclass(frozen=True)
class RolloutCorrection:
    """IS weights and / or rejection from rho = pi_old / pi_rollout, as `config` (RolloutCorrectionConfig, which
    holds and documents each option) says; metrics always.

    is_level: "token" | "sequence" | "geometric" (ops.rollout_correction) or
        "off"; the policy loss per token is multiplied by the detached weight
        min(rho_level, is_threshold) (verl's rollout_is, TIS), or with
        is_threshold_lower (IcePop) by rho_level inside [is_threshold_lower,
        is_threshold] and 0 outside; is_batch_normalize divides the weights by
        their mean over the micro-batch (verl's rollout_is_batch_normalize).
    rs_level: same levels, or "max" for k2 / k3, or "off"; tokens (token level)
        or rows whose statistic fails get no loss from any term (verl's
        rollout_rs). rs_estimator "k1": rho_level outside [rs_threshold_lower,
        rs_threshold] fails (rs_threshold_lower None is 1 / rs_threshold, as
        verl); "k2" / "k3": the token divergence (ops.token_divergence), or its
        row sum (sequence), mean (geometric) or max, above rs_threshold fails
        (verl's token_k3, seq_sum_k2, seq_max_k3, ...).
    bypass: verl's bypass mode, where the batch's old logprobs are the sampler's
        (flowrl.rl.bypass): rho = pi_current / pi_rollout, from the current
        policy's logprobs (detached) in the loss, not from old_logprobs.
    Both off: only the metrics (rollout/kl, rollout/k3_kl, rollout/max_abs_diff,
    rollout/masked_fraction); is_level adds rollout/is_weight_mean and
    rollout/is_truncated_fraction (before normalisation), is_batch_normalize
    rollout/is_batch_norm_factor.
    """

    config: RolloutCorrectionConfig
    bypass: bool = False

    @property
    def is_level(self) -> str | None:
        return None if self.config.is_level == "off" else self.config.is_level

    @property
    def rs_level(self) -> str | None:
        return None if self.config.rs_level == "off" else self.config.rs_level

    def __call__(self, old_logprobs_BT: torch.Tensor, rollout_logprobs_BT: torch.Tensor,
                 mask_BT: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, dict[str, torch.Tensor]]:
        """(IS weights or None, keep mask or None, metrics with the "rollout/" prefix)."""
        c, old_BT, rollout_BT = self.config, old_logprobs_BT.detach(), rollout_logprobs_BT.detach()
        log_rho_BT = rc.log_ratio(old_BT, rollout_BT, mask_BT)
        metrics = rc.mismatch_metrics(old_BT, rollout_BT, mask_BT)
        weights_BT = keep_BT = None
        if self.is_level is not None:
            weights_BT = rc.truncated_is_weights(log_rho_BT, mask_BT, self.is_level, c.is_threshold,
                                                 c.is_threshold_lower)
            metrics.update(rc.is_weight_metrics(weights_BT, log_rho_BT, mask_BT, self.is_level, c.is_threshold,
                                                c.is_threshold_lower))
            if c.is_batch_normalize:
                metrics["is_batch_norm_factor"] = rc.mean_weight(weights_BT, mask_BT, self.is_level)
                weights_BT = rc.batch_normalized(weights_BT, mask_BT, self.is_level)
        if self.rs_level is not None:
            keep_BT = rc.rejection_keep_mask(log_rho_BT, mask_BT, self.rs_level, c.rs_threshold,
                                             c.rs_threshold_lower, c.rs_estimator)
        metrics["masked_fraction"] = 0.0 if keep_BT is None else rc.masked_fraction(keep_BT, mask_BT)
        return weights_BT, keep_BT, {PREFIX + key: value for key, value in metrics.items()}


class RolloutCorrectionConfig(BaseModel):
    """`algo.rollout_correction.*`: verl's algorithm.rollout_correction (decoupled mode) for any policy loss."""

    model_config = ConfigDict(extra="forbid")
    is_level: Literal["off", "token", "sequence", "geometric"] = Field(
        "off", description="Truncated IS weight min(rho, is_threshold) on the policy loss, rho = pi_old / "
                           "pi_rollout per token, per sequence (product) or geometric mean (verl's rollout_is).")
    is_threshold: float = Field(2.0, gt=0, description="Truncation of the IS weight (verl's rollout_is_threshold).")
    is_threshold_lower: float | None = Field(None, gt=0, description="IcePop: weights whose rho is outside "
                                             "[is_threshold_lower, is_threshold] are 0, the others untruncated "
                                             "(verl's \"lower_upper\" rollout_is_threshold).")
    is_batch_normalize: bool = Field(False, description="Divide the IS weights by their mean over the micro-batch "
                                                        "(verl's rollout_is_batch_normalize).")
    rs_level: Literal["off", "token", "sequence", "geometric", "max"] = Field(
        "off", description="Rejection: drop tokens (token) or responses (sequence: sum, geometric: mean, max: "
                           "max over the row) whose statistic fails (verl's rollout_rs).")
    rs_estimator: Literal["k1", "k2", "k3"] = Field(
        "k1", description="k1: rho outside [rs_threshold_lower, rs_threshold] fails; k2, k3: the divergence "
                          "(log rho)^2 / 2 or rho - 1 - log rho above rs_threshold fails (verl's token_k3, ...).")
    rs_threshold: float = Field(2.0, gt=0, description="Upper bound of rho (k1) or of the divergence (k2, k3) "
                                                       "for rejection (verl's rollout_rs_threshold).")
    rs_threshold_lower: float | None = Field(None, gt=0, description="Lower bound of rho for k1 rejection; "
                                                                     "None is 1 / rs_threshold.")
    log_mismatch: bool = Field(False, description="Log the sampler/trainer mismatch (actor/rollout/*) with both "
                                             "corrections off; always logged when one is on.")

    @model_validator(mode="after")
    def _check(self) -> "RolloutCorrectionConfig":
        self._check_bounds()
        unused = [name for name, off in (("is_threshold", self.is_level == "off"),
                                         ("is_threshold_lower", self.is_level == "off"),
                                         ("is_batch_normalize", self.is_level == "off"),
                                         ("rs_threshold", self.rs_level == "off"),
                                         ("rs_threshold_lower", self.rs_level == "off"),
                                         ("rs_estimator", self.rs_level == "off"),
                                         ("log_mismatch", self.is_level != "off" or self.rs_level != "off"))
                  if off and name in self.model_fields_set]
        for name in unused:
            warnings.warn(f"algo.rollout_correction.{name} has no effect with is_level={self.is_level!r}, "
                          f"rs_level={self.rs_level!r}", stacklevel=2)
        return self

    def _check_bounds(self) -> None:
        """ValueError naming the field whose bound or estimator does not fit the level it serves."""
        if self.is_level != "off" and self.is_threshold_lower is not None:
            rc.check_bounds(self.is_threshold, self.is_threshold_lower, "is_threshold", "is_threshold_lower")
        if self.rs_level == "off":
            return
        rc.check_estimator(self.rs_estimator, self.rs_level, "rs_estimator")
        if self.rs_estimator == "k1":
            rc.check_bounds(self.rs_threshold, self.rs_threshold_lower, "rs_threshold", "rs_threshold_lower")
        elif self.rs_threshold_lower is not None:
            raise ValueError(f"rs_threshold_lower: the {self.rs_estimator} rejection bounds the divergence above "
                             f"only (verl's single upper threshold), got {self.rs_threshold_lower}")

    def build(self) -> RolloutCorrection | None:
        """The loss option; None (the loss unchanged) when both corrections and the metrics are off."""
        if self.is_level == "off" and self.rs_level == "off" and not self.log_mismatch:
            return None
        return RolloutCorrection(self)
