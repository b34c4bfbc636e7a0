"""Reward roles: the task's reward function (on the driver), or a learned reward model (on a pool)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict
from transformers import AutoConfig

from flowrl import metrics
from flowrl.data.batch import MODEL_INPUT, column
from flowrl.data.scoring.pool import call_with_deadline, check_reward
from flowrl.engines.protocols import RewardFn, TrainEngine
from flowrl.graph.role import graph_method, role
from flowrl.roles.configs import TrainRoleConfig
from flowrl.roles.context import BuildContext, UpdateSettings


def _scores_key(key: str = "scores", **_: Any) -> tuple[str, ...]:
    return (key,)


@role("reward", on_driver=True)
@dataclass
class Reward:
    fn: RewardFn
    tokenizer: Any
    meta_keys: tuple[str, ...] = ()
    timeout_s: float | None = None  # data.reward_fn_timeout_s: a call past it stops the run in one line

    @classmethod
    def build(cls, ctx: BuildContext) -> "Reward":
        if ctx.task is None:
            raise ValueError("role 'reward' scores with the task's reward function, but no task was given")
        return cls(fn=ctx.task.reward, tokenizer=ctx.tokenizer, meta_keys=tuple(ctx.task.meta_keys),
                   timeout_s=ctx.reward_fn_timeout_s)

    @graph_method(reads=("response_ids", "response_mask"), writes=_scores_key)
    def score(self, batch: TensorDict, metric: str = "reward", key: str = "scores") -> TensorDict:
        """Scores each response into `key`; logs `<metric>/mean` (a baseline pass names its own metric)."""
        texts = decode_responses(self.tokenizer, batch)
        meta = [dict(zip(self.meta_keys, row)) for row in zip(*(column(batch, k) for k in self.meta_keys))]
        try:
            raw = call_with_deadline(self.fn, (texts, meta or [{}] * len(texts)), self.timeout_s,
                                     f"reward function {_name(self.fn)} (data.reward_fn_timeout_s)")
        except (TimeoutError, KeyboardInterrupt):
            raise
        except BaseException as err:  # the user's function (SystemExit(0) too): name it and the batch, in one line
            name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
            raise ValueError(f"reward function {name} raised {type(err).__name__}: {err} (scoring {len(texts)} "
                             f"responses, the first {texts[0]!r})") from err
        scores = _as_scores(raw, self.fn)
        if scores.shape != (len(texts),):
            raise ValueError(f"reward function returned {tuple(scores.shape)} scores for {len(texts)} responses")
        for i, value in enumerate(scores.tolist()):  # inf, nan or 3e38 would turn the advantages to nan
            check_reward(value, f"response {i} of the batch ({texts[i]!r}) from reward function "
                                f"{getattr(self.fn, '__qualname__', type(self.fn).__name__)}")
        batch[key] = scores.float()
        metrics.log(f"{metric}/mean", batch[key].mean())
        return batch


@role("reward_model", engines=("actor",), config=TrainRoleConfig)
@dataclass
class RewardModel:
    """A learned reward (verl's reward model): a scalar-head model's output at each response's last token.

    The engine is a TrainEngine with the "reward" head over a token- or sequence-classification checkpoint
    (num_labels=1) that shares the policy's tokenizer; it is only ever run forward. Bind it to the `reward`
    parameter (model.reward_path does) or use it beside a rule reward as the `reward_model` role.
    """

    engine: TrainEngine
    settings: UpdateSettings = field(default_factory=UpdateSettings)

    @classmethod
    def build(cls, ctx: BuildContext) -> "RewardModel":
        if ctx.reward_model is None:
            raise ValueError(f"model.reward_path: role {ctx.name!r} is a learned reward model, so it needs "
                             f"model.reward_path")
        vocab_size = AutoConfig.from_pretrained(str(ctx.reward_model.path), local_files_only=True).vocab_size
        if vocab_size != len(ctx.tokenizer):
            raise ValueError(f"model.reward_path: the reward model's vocab_size {vocab_size} differs from the "
                             f"policy tokenizer's {len(ctx.tokenizer)}; it must share the policy's tokenizer")
        engine = ctx.config.engine.build(ctx.reward_model, head="reward", device=ctx.device, trainable=False)
        return cls(engine=engine, settings=ctx.settings)

    @graph_method(reads=MODEL_INPUT, writes=_scores_key)
    def score(self, batch: TensorDict, metric: str = "reward", key: str = "scores") -> TensorDict:
        scores_BR = self.engine.forward(batch, micro_batch_size=self.settings.forward_rows)["scores"]
        last_B = (batch["response_mask"].sum(-1) - 1).clamp(min=0)
        batch[key] = scores_BR.gather(1, last_B.unsqueeze(-1)).squeeze(-1)
        metrics.log(f"{metric}/mean", batch[key].mean())
        return batch


def _as_scores(raw: Any, fn: Any) -> torch.Tensor:
    """The reward's return as float64 (1e39 is not inf yet), or one line naming the function and what it gave."""
    try:
        return torch.tensor(raw, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as err:
        first = raw[0] if isinstance(raw, (list, tuple)) and raw else raw
        raise ValueError(f"reward function {_name(fn)} returned {type(raw).__name__} of {type(first).__name__} "
                         f"({first!r}...); expected one number per response ({err})") from None


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", type(fn).__name__)


def decode_responses(tokenizer: Any, batch: TensorDict) -> list[str]:
    ids, mask = batch["response_ids"], batch["response_mask"].bool()
    eos = tokenizer.eos_token_id
    return [tokenizer.decode([t for t in row[m].tolist() if t != eos]) for row, m in zip(ids, mask)]
