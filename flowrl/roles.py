"""Model roles: the graph's nodes call their methods; engines are injected.

Each `@graph_method` declares the fields it reads and writes, so tracing checks
an algorithm without building any of these. Methods take and return the whole
batch and report metrics through `flowrl.metrics.log`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict

from flowrl import metrics
from flowrl.batch import MODEL_INPUT, column, repeat_rows, response_lengths
from flowrl.engines.protocols import LossFn, RewardFn, RolloutEngine, SamplingParams, TrainEngine, WeightSync
from flowrl.errors import GraphError
from flowrl.trace import graph_method


@dataclass
class UpdateSettings:
    mini_batch_size: int = 32
    micro_batch_size: int = 16
    epochs: int = 1
    temperature: float = 1.0


def _update_reads(loss: LossFn, **_: Any) -> tuple[str, ...]:
    return MODEL_INPUT + tuple(loss.reads)


def _logprobs(engine: TrainEngine, s: UpdateSettings, batch: TensorDict) -> torch.Tensor:
    return engine.forward(batch, temperature=s.temperature, micro_batch_size=s.micro_batch_size)["logprobs"]


def _update(engine: TrainEngine, s: UpdateSettings, batch: TensorDict, loss: LossFn, seed: int | None,
            prefix: str, **kwargs: Any) -> None:
    """One engine update; metrics logged under `prefix`."""
    result = engine.update(batch, loss, mini_batch_size=s.mini_batch_size, micro_batch_size=s.micro_batch_size,
                           epochs=s.epochs, shuffle_seed=seed, **kwargs)
    metrics.log_dict(prefix, result)


@dataclass
class Actor:
    engine: TrainEngine
    settings: UpdateSettings = field(default_factory=UpdateSettings)
    version: int = 0  # bumped by every update; the rollout syncs when it lags
    _deferred: bool = False  # old logprobs left to the coming single-step update

    @graph_method(reads=MODEL_INPUT, writes=("old_logprobs",))
    def logprobs(self, batch: TensorDict, on_policy: bool = False) -> TensorDict:
        """Old logprobs. The planner sets `on_policy` when only actor.update reads them; then, if
        that update is one optimizer step, they equal its current logprobs and are not computed here."""
        if on_policy and self._single_step(batch):
            self._deferred = True
            batch["old_logprobs"] = torch.full(batch["response_mask"].shape, float("nan"))
            return batch
        batch["old_logprobs"] = _logprobs(self.engine, self.settings, batch)
        return batch

    @graph_method(reads=_update_reads)
    def update(self, batch: TensorDict, loss: LossFn, seed: int | None = None) -> TensorDict:
        deferred, self._deferred = self._deferred, False
        assert not deferred or self._single_step(batch), "deferred old logprobs need a single-step update"
        _update(self.engine, self.settings, batch, loss, seed, "actor", temperature=self.settings.temperature,
                old_logprobs_from_current=deferred)
        self.version += 1
        return batch

    def _single_step(self, batch: TensorDict) -> bool:
        return self.settings.epochs == 1 and batch.batch_size[0] <= self.settings.mini_batch_size


@dataclass
class Ref:
    engine: TrainEngine
    settings: UpdateSettings = field(default_factory=UpdateSettings)

    @graph_method(reads=MODEL_INPUT, writes=("ref_logprobs",))
    def logprobs(self, batch: TensorDict) -> TensorDict:
        batch["ref_logprobs"] = _logprobs(self.engine, self.settings, batch)
        return batch


@dataclass
class Critic:
    engine: TrainEngine
    settings: UpdateSettings = field(default_factory=UpdateSettings)

    @graph_method(reads=MODEL_INPUT, writes=("values",))
    def values(self, batch: TensorDict) -> TensorDict:
        out = self.engine.forward(batch, micro_batch_size=self.settings.micro_batch_size)
        batch["values"] = out["values"] * batch["response_mask"]
        return batch

    @graph_method(reads=_update_reads)
    def update(self, batch: TensorDict, loss: LossFn, seed: int | None = None) -> TensorDict:
        _update(self.engine, self.settings, batch, loss, seed, "critic")
        return batch


def _check_sampling(n: int = 1, **sampling: Any) -> None:
    if not isinstance(n, int) or n < 1:
        raise GraphError(f"rollout.generate: n must be an int >= 1, got {n!r}")
    unknown = sorted(set(sampling) - set(SamplingParams.__dataclass_fields__))
    if unknown:
        raise GraphError(f"rollout.generate: unknown sampling option {unknown[0]!r}; "
                         f"options are {sorted(SamplingParams.__dataclass_fields__)}")


@dataclass
class Rollout:
    engine: RolloutEngine
    params: SamplingParams
    actor: Actor | None = None
    weight_sync: WeightSync | None = None
    seed: int = 0
    step: int = 0  # set by the executor so sampling is reproducible across resume
    synced_version: int = 0
    _calls: int = 0

    def begin_step(self, step: int) -> None:
        self.step, self._calls = step, 0

    @graph_method(reads=("prompt_ids", "prompt_mask", "uid"),
                  writes=("response_ids", "response_mask", "group"), kind="rows", check=_check_sampling)
    def generate(self, batch: TensorDict, n: int = 1, **sampling: Any) -> TensorDict:
        _check_sampling(n, **sampling)
        params = SamplingParams(**{**self.params.__dict__, **sampling})
        rows = repeat_rows(batch, n)
        self._calls += 1
        seed = (self.seed * 1_000_003 + self.step * 1_009 + self._calls) % (2**31)
        out = self.engine.generate(rows["prompt_ids"], rows["prompt_mask"], params, seed=seed)
        rows["response_ids"], rows["response_mask"] = out["response_ids"], out["response_mask"]
        rows["group"] = rows["uid"].clone()
        lengths = response_lengths(rows).float()
        metrics.log("response_length/mean", lengths.mean())
        metrics.log("response_length/clip_ratio", (lengths >= params.max_new_tokens).float().mean())
        return rows

    @graph_method(kind="sync")
    def sync_weights(self, batch: TensorDict) -> TensorDict:
        """Hybrid engine: bring the actor's latest weights into the rollout engine."""
        if self.actor is not None and self.weight_sync is not None and self.synced_version != self.actor.version:
            self.weight_sync(self.actor.engine, self.engine)
            self.synced_version = self.actor.version
        return batch


@dataclass
class Reward:
    fn: RewardFn
    tokenizer: Any
    meta_keys: tuple[str, ...] = ()

    @graph_method(reads=("response_ids", "response_mask"), writes=("scores",))
    def score(self, batch: TensorDict, metric: str = "reward") -> TensorDict:
        """Scores each response; logs `<metric>/mean` (a baseline pass names its own metric)."""
        texts = decode_responses(self.tokenizer, batch)
        meta = [dict(zip(self.meta_keys, row)) for row in zip(*(column(batch, k) for k in self.meta_keys))]
        scores = torch.tensor(self.fn(texts, meta or [{}] * len(texts)), dtype=torch.float32)
        if scores.shape != (len(texts),):
            raise ValueError(f"reward function returned {tuple(scores.shape)} scores for {len(texts)} responses")
        if not torch.isfinite(scores).all():
            bad = int((~torch.isfinite(scores)).nonzero()[0])
            raise ValueError(f"reward function returned {scores[bad].item()} for response {texts[bad]!r}; "
                             f"scores must be finite")
        batch["scores"] = scores
        metrics.log(f"{metric}/mean", scores.mean())
        return batch


@dataclass
class RewardModel:
    """A learned reward (verl's reward model): a scalar-head model's output at each response's last token.

    The engine is a TrainEngine of kind "reward" over a token- or sequence-classification checkpoint
    (num_labels=1) that shares the policy's tokenizer; it is only ever run forward.
    """

    engine: TrainEngine
    settings: UpdateSettings = field(default_factory=UpdateSettings)

    @graph_method(reads=MODEL_INPUT, writes=("scores",))
    def score(self, batch: TensorDict, metric: str = "reward") -> TensorDict:
        scores_BR = self.engine.forward(batch, micro_batch_size=self.settings.micro_batch_size)["scores"]
        last_B = (batch["response_mask"].sum(-1) - 1).clamp(min=0)
        batch["scores"] = scores_BR.gather(1, last_B.unsqueeze(-1)).squeeze(-1)
        metrics.log(f"{metric}/mean", batch["scores"].mean())
        return batch


def decode_responses(tokenizer: Any, batch: TensorDict) -> list[str]:
    ids, mask = batch["response_ids"], batch["response_mask"].bool()
    eos = tokenizer.eos_token_id
    return [tokenizer.decode([t for t in row[m].tolist() if t != eos]) for row, m in zip(ids, mask)]


ROLE_CLASSES: dict[str, type] = {"actor": Actor, "ref": Ref, "critic": Critic, "rollout": Rollout, "reward": Reward}
