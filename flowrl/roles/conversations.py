"""Roles of the supervised graphs: `conversations` turns data rows into model rows, `learned_reward` trains a
scalar-head model on preference pairs.

`conversations.encode` tokenizes each row's conversation (flowrl.data.conversations.encode_conversation)
and splits it at the first assistant token: the tokens before it are the row's prompt, the rest its
response, and `loss_mask` is 1 on the assistant's tokens only (later user turns sit in the response with
loss 0, as tool output does in multi-turn rollouts). The rows were not sampled, so their SAMPLED_WITH
columns say temperature 1, nothing truncated: the actor scores them under the plain softmax.
`conversations.encode_pairs` makes two adjacent rows of each preference pair (chosen, then rejected).
Rows longer than `max_length` tokens are cut to it (verl's truncation="right").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict

from flowrl.data.batch import MODEL_INPUT, column, left_pad, right_pad
from flowrl.data.conversations import ConversationTask, encode_conversation
from flowrl.engines.protocols import LossFn, SamplingParams, TrainEngine
from flowrl.engines.sampling import SAMPLED_WITH, sampling_columns
from flowrl import metrics
from flowrl.graph.role import graph_method, role
from flowrl.rl.sft_loss import last_token
from flowrl.roles.configs import ScoreHeadConfig
from flowrl.roles.context import BuildContext, UpdateSettings

ENCODED = (*MODEL_INPUT, "loss_mask", *SAMPLED_WITH)
PAIRED = (*ENCODED, "group", "preference")


def model_rows(encoded: list[tuple[list[int], list[int]]], pad_id: int, max_length: int | None) -> dict[str, Any]:
    """Prompt (before the first assistant token, at least one token), response and loss mask of each row."""
    prompts, responses, losses = [], [], []
    for ids, mask in encoded:
        ids, mask = ids[:max_length], mask[:max_length]
        split = max(1, mask.index(1) if 1 in mask else len(ids) - 1)
        prompts.append(ids[:split])
        responses.append(ids[split:])
        losses.append(mask[split:])
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    response_ids, response_mask = right_pad(responses, pad_id)
    loss_mask = right_pad(losses, 0)[0] * response_mask
    return dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                response_mask=response_mask, loss_mask=loss_mask)


@role("conversations", on_driver=True)
@dataclass
class Conversations:
    tokenizer: Any
    max_length: int | None = None

    @classmethod
    def build(cls, ctx: BuildContext) -> "Conversations":
        task = ctx.task
        return cls(ctx.tokenizer, task.max_length if isinstance(task, ConversationTask) else None)

    @graph_method(reads=("conversation", "uid"), writes=ENCODED)
    def encode(self, batch: TensorDict) -> TensorDict:
        """Each row's conversation as model rows; logs `sft/loss_tokens` (trained tokens per row)."""
        encoded = [self._encode(json.loads(text), uid) for text, uid in zip(column(batch, "conversation"),
                                                                              batch["uid"].tolist())]
        rows = self._set(batch, model_rows(encoded, self.tokenizer.pad_token_id, self.max_length))
        metrics.log("sft/loss_tokens", rows["loss_mask"].sum(-1).float().mean())
        return rows

    @graph_method(reads=("pair", "uid"), writes=PAIRED, kind="rows")
    def encode_pairs(self, batch: TensorDict) -> TensorDict:
        """Rows 2i and 2i + 1 are pair i's chosen and rejected responses after its prompt; `group` is its uid."""
        encoded = []
        for text, uid in zip(column(batch, "pair"), batch["uid"].tolist()):
            prompt, chosen, rejected = json.loads(text)
            encoded += [self._encode(prompt + chosen, uid), self._encode(prompt + rejected, uid)]
        rows = batch[torch.arange(batch.batch_size[0]).repeat_interleave(2)]
        rows = self._set(rows, model_rows(encoded, self.tokenizer.pad_token_id, self.max_length))
        rows["group"] = rows["uid"].clone()
        rows["preference"] = torch.tensor([1, -1] * batch.batch_size[0], dtype=torch.long)
        return rows

    def _encode(self, messages: list[dict[str, str]], uid: int) -> tuple[list[int], list[int]]:
        try:
            return encode_conversation(self.tokenizer, messages)
        except ValueError as err:
            raise ValueError(f"data.train_files or val_files: prompt {uid} of the stream: {err}") from None

    @staticmethod
    def _set(batch: TensorDict, fields: dict[str, torch.Tensor]) -> TensorDict:
        rows = batch.batch_size[0]
        for key, value in {**fields, **sampling_columns(SamplingParams(), rows)}.items():
            batch[key] = value
        return batch


def _update_reads(loss: LossFn, **_: Any) -> tuple[str, ...]:
    return MODEL_INPUT + tuple(loss.reads)


@role("learned_reward", trainable=True, exported=True, engines=("actor",), config=ScoreHeadConfig)
@dataclass
class LearnedReward:
    """A scalar head over the model (the reward model's layout: flowrl.roles.reward.RewardModel reads what
    this exports), trained on pairs; its section starts from the actor's engine values (roles.actor.lr, ...)."""

    engine: TrainEngine
    settings: UpdateSettings = field(default_factory=UpdateSettings)
    version: int = 0

    @graph_method(reads=MODEL_INPUT, writes=("rm_scores",))
    def scores(self, batch: TensorDict) -> TensorDict:
        """Each row's score at its last response token."""
        out = self.engine.forward(batch, micro_batch_size=self.settings.forward_rows)["scores"]
        batch["rm_scores"] = last_token(out, batch["response_mask"])
        return batch

    @graph_method(reads=_update_reads, updates_weights=True)
    def update(self, batch: TensorDict, loss: LossFn, seed: int | None = None) -> TensorDict:
        """One pass in row order, a mini-batch per micro-batch: a pair's rows (adjacent) meet in one loss."""
        s = self.settings
        if s.mini_batch_size % 2:
            raise ValueError(f"roles.learned_reward.mini_batch_size: a rank's share {s.mini_batch_size} is odd, so "
                             f"a preference pair's two rows would straddle mini-batches; make it even")
        result = self.engine.update(batch, loss, mini_batch_size=s.mini_batch_size,
                                    micro_batch_size=s.mini_batch_size, epochs=s.epochs)
        metrics.log_dict("rm", result)
        self.version += 1
        return batch
