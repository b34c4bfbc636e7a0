"""The policy and its relatives: actor (trained, followed by the rollout), reference, critic, and the
distillation teacher."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from tensordict import TensorDict

from flowrl import metrics
from flowrl.data.batch import MODEL_INPUT
from flowrl.engines.train.model_outputs import check_outputs, topk_outputs
from flowrl.engines.protocols import LossFn, TrainEngine
from flowrl.engines.train.rank_balance import exchange
from flowrl.engines.sampling import SAMPLED_WITH
from flowrl.graph.role import graph_method, role
from flowrl.graph.trace import Deferred
from flowrl.roles.configs import ActorConfig, CriticConfig, RefConfig, TeacherConfig
from flowrl.roles.context import UpdateSettings


POLICY_INPUT = MODEL_INPUT + SAMPLED_WITH  # the policy scores each row under the distribution it was sampled from


def _update_reads(loss: LossFn, **_: Any) -> tuple[str, ...]:
    return POLICY_INPUT + tuple(loss.reads)


def _value_reads(loss: LossFn, **_: Any) -> tuple[str, ...]:
    return MODEL_INPUT + tuple(loss.reads)


def _logprobs(engine: TrainEngine, s: UpdateSettings, batch: TensorDict) -> torch.Tensor:
    return _forward(engine, s, batch)["logprobs"]


def _forward(engine: TrainEngine, s: UpdateSettings, batch: TensorDict, balance: bool = True,
             **kwargs: Any) -> dict[str, torch.Tensor]:
    """engine.forward over this rank's rows; with train.balance_batch (and `balance`) over rows balanced across
    the pool's ranks (flowrl.engines.train.rank_balance), its outputs brought back to these rows."""
    moved = exchange(batch, batch.batch_size[0]) if s.balance_batch and balance else None
    out = engine.forward(batch if moved is None else moved.rows, micro_batch_size=s.forward_rows, **kwargs)
    return out if moved is None else moved.restore(out)


def _balanced(s: UpdateSettings, batch: TensorDict) -> TensorDict:
    """The rows an update of this rank runs on: with train.balance_batch, each mini-batch's rows over the pool's
    ranks balanced by tokens (the same rows per optimizer step: flowrl.engines.train.rank_balance), else `batch`."""
    moved = exchange(batch, s.mini_batch_size) if s.balance_batch else None
    return batch if moved is None else moved.rows


def _teacher_writes(topk: int = 0, **_: Any) -> tuple[str, ...]:
    if topk:
        topk_outputs(topk)  # a bad count fails when the graph is traced
    return ("teacher_logprobs",) + (("teacher_topk_logprobs", "teacher_topk_ids") if topk else ())


def _logprobs_writes(outputs: tuple[str, ...] = (), **_: Any) -> tuple[str, ...]:
    return ("old_logprobs", *_extra_outputs(outputs))


def _extra_outputs(outputs: tuple[str, ...]) -> tuple[str, ...]:
    """`outputs` checked against the actor's output table (flowrl.engines.train.model_outputs) when the graph is
    traced, before any model loads; "logprobs" is always computed (written as old_logprobs)."""
    if isinstance(outputs, str):
        raise ValueError(f"outputs: a tuple of model output names, e.g. ({outputs!r},), got the string {outputs!r}")
    return tuple(name for name in check_outputs("actor", ("logprobs", *outputs)) if name != "logprobs")


def _update(engine: TrainEngine, s: UpdateSettings, batch: TensorDict, loss: LossFn, seed: int | None,
            prefix: str, **kwargs: Any) -> None:
    """One engine update (on `batch` as _balanced gives it); metrics logged under `prefix`."""
    result = engine.update(batch, loss, mini_batch_size=s.mini_batch_size, micro_batch_size=s.micro_batch_size,
                           epochs=s.epochs, shuffle_seed=seed, **kwargs)
    metrics.log_dict(prefix, result)


@role("actor", trainable=True, exported=True, engines=("actor",), config=ActorConfig)
@dataclass
class Actor:
    engine: TrainEngine
    settings: UpdateSettings = field(default_factory=UpdateSettings)
    version: int = 0  # bumped by every update; a role following these weights syncs when it lags

    @graph_method(reads=POLICY_INPUT, writes=_logprobs_writes, defer_to="update")
    def logprobs(self, batch: TensorDict, outputs: tuple[str, ...] = ()) -> TensorDict:
        """Old logprobs, and each of `outputs` (other outputs of the actor's table, flowrl.engines.train.model_outputs,
        e.g. "entropy") of the current policy under its own name. When only actor.update reads them,
        the plan folds this call into it (its `deferred`)."""
        return self._logprobs(batch, outputs)

    def _logprobs(self, batch: TensorDict, outputs: tuple[str, ...] = (), balance: bool = True) -> TensorDict:
        extra = _extra_outputs(outputs)
        out = _forward(self.engine, self.settings, batch, balance, outputs=("logprobs", *extra))
        batch["old_logprobs"] = out["logprobs"]
        for name in extra:
            batch[name] = out[name]
        return batch

    @graph_method(reads=_update_reads, updates_weights=True)
    def update(self, batch: TensorDict, loss: LossFn, seed: int | None = None,
               deferred: Deferred | None = None) -> TensorDict:
        """One update. `deferred`: the plan folded this role's logprobs call into it (only the update reads the
        old logprobs). A single optimizer step takes them from its own forward pass at the same weights and
        skips the call; otherwise the call runs first, on a copy: the batch gets no old_logprobs either way."""
        single = deferred is not None and self._single_step(batch)
        assert deferred is None or deferred.method == "logprobs", deferred
        rows = _balanced(self.settings, batch)  # balanced already: the deferred call runs on them where they are
        inputs = rows if deferred is None or single else self._logprobs(rows.copy(), balance=False,
                                                                        **deferred.kwargs)
        _update(self.engine, self.settings, inputs, loss, seed, "actor", old_logprobs_from_current=single)
        self.version += 1
        return batch

    def _single_step(self, batch: TensorDict) -> bool:
        return self.settings.epochs == 1 and batch.batch_size[0] <= self.settings.mini_batch_size


@role("ref", base_of="actor", engines=("actor",), config=RefConfig)
@dataclass
class Ref:
    engine: TrainEngine
    settings: UpdateSettings = field(default_factory=UpdateSettings)

    @graph_method(reads=POLICY_INPUT, writes=("ref_logprobs",))
    def logprobs(self, batch: TensorDict) -> TensorDict:
        batch["ref_logprobs"] = _logprobs(self.engine, self.settings, batch)
        return batch


@role("teacher", engines=("actor",), config=TeacherConfig)
@dataclass
class Teacher:
    """On-policy distillation's teacher: a frozen model of its own (roles.teacher.model) scoring the student's
    samples (flowrl.rl.distillation)."""

    engine: TrainEngine
    settings: UpdateSettings = field(default_factory=UpdateSettings)
    release: Callable[[], None] = field(default=lambda: None)  # the engine's config's closer (vLLM's shutdown)

    @graph_method(reads=POLICY_INPUT, writes=_teacher_writes)
    def logprobs(self, batch: TensorDict, topk: int = 0) -> TensorDict:
        """The teacher's logprobs of the sampled tokens, under the distribution each row was sampled with;
        with `topk`, also its `topk` largest logprobs at each token and their token ids, [B, R, topk] each
        (teacher_topk_logprobs, teacher_topk_ids: forward top-k KL, flowrl.rl.distillation), from the same
        forward pass, computed chunk by chunk (flowrl.engines.train.model_outputs)."""
        top = topk_outputs(topk) if topk else ()
        out = _forward(self.engine, self.settings, batch, outputs=("logprobs", *top))
        batch["teacher_logprobs"] = out["logprobs"]
        if top:
            batch["teacher_topk_logprobs"], batch["teacher_topk_ids"] = out[top[0]], out[top[1]]
        return batch

    def close(self) -> None:
        """The run is over: release the engine (flowrl.graph.role.close_role)."""
        self.release()


@role("critic", trainable=True, engines=("critic",), config=CriticConfig)
@dataclass
class Critic:
    engine: TrainEngine
    settings: UpdateSettings = field(default_factory=UpdateSettings)

    @graph_method(reads=MODEL_INPUT, writes=("values",))
    def values(self, batch: TensorDict) -> TensorDict:
        batch["values"] = _forward(self.engine, self.settings, batch)["values"] * batch["response_mask"]
        return batch

    @graph_method(reads=_value_reads)
    def update(self, batch: TensorDict, loss: LossFn, seed: int | None = None) -> TensorDict:
        _update(self.engine, self.settings, _balanced(self.settings, batch), loss, seed, "critic")
        return batch
