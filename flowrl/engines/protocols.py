"""Engine protocols: what roles need from a model backend.

Roles (actor, rollout, ref, critic) hold engines and never import a backend,
so graph logic runs on CPU with fakes. Batch conventions (TensorDict, batch
size [B]):

- prompt_ids_BP / prompt_mask_BP: left-padded prompts.
- response_ids_BR / response_mask_BR: right-padded responses; the mask is 1 on
  every generated token, the eos token included, and 0 on padding.
- loss_mask_BR: 1 on the response tokens the losses count (the policy's own
  tokens; tool output spliced into a response is in response_mask only, see
  flowrl.engines.agents.loop).
- rollout_logprobs_BR: the sampler's logprob of each response token under the
  distribution it was sampled from (temperature, top-k, top-p applied).
- finish_reason_B: a FinishReason per row; policy_version_B: the update count
  of the weights that generated the row.
- sample_temperature_B / sample_top_k_B / sample_top_p_B: how the row was
  sampled (written by the rollout role; flowrl.engines.sampling); a train
  engine scores the row's tokens under that distribution.
- The model input is cat(prompt, response) along time, so the logprob of
  response token t comes from the logits at position P - 1 + t.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Protocol

import torch
from tensordict import TensorDict

from flowrl.engines.weights.buckets import SYNC_TIMEOUT_S


class FinishReason(enum.IntEnum):
    STOP = 0  # the response ended with eos
    LENGTH = 1  # it reached max_new_tokens
    MAX_TURNS = 2  # a multi-turn episode reached roles.rollout.max_turns before the environment ended it
    MAX_TOKENS = 3  # a multi-turn episode ran out of roles.rollout.max_total_tokens


@dataclass(frozen=True)
class SamplingParams:
    """How the rollout engine samples one response per prompt row."""

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    greedy: bool = False
    ignore_eos: bool = False  # every response runs to max_new_tokens (vLLM's ignore_eos; for benchmarks)


class LossFn(Protocol):
    """A loss the train engine evaluates on each micro-batch.

    `out` holds the model outputs named in `needs`, each [B, R] aligned to the
    response (flowrl.engines.train.model_outputs: an actor's "logprobs", "entropy",
    ...; a critic's "values"), and nothing else: the engine computes only
    those; `reads` are the batch fields it reads. Returns the micro-batch
    loss and detached scalar metrics: 0-d tensors (or floats), which the
    engine reads once, after the update, so that no micro-batch waits on
    the device.

    `combine` says how micro-batch losses make the mini-batch's loss:
    "mean": each is a mean in the loss's own unit and `weight(mb)` is the
    micro-batch's count in that unit (valid tokens for token-mean, sequences
    for seq-mean), so the engine weights each by weight / total weight;
    "sum": each is a sum and the mini-batch's loss is their sum (token-sum),
    `weight(mb)` is 0 for a micro-batch with nothing to count, else 1. Either
    way a mini-batch's gradient is the same however it is split.
    """

    reads: tuple[str, ...]
    needs: tuple[str, ...]
    combine: Literal["mean", "sum"]

    def __call__(self, out: dict[str, torch.Tensor], mb: TensorDict) -> tuple[torch.Tensor, dict[str, float]]: ...

    def weight(self, mb: TensorDict) -> float: ...


class TrainEngine(Protocol):
    """A trainable model: forward passes over a batch and optimizer steps."""

    model: torch.nn.Module  # the module it trains (the hybrid engine's rollout generates with it)
    lora: bool  # only LoRA adapters train (checkpoints, syncs and exports handle the adapters)

    def forward(self, batch: TensorDict, *, temperature: float = 1.0, micro_batch_size: int = 8,
                outputs: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
        """No-grad outputs aligned to the response, 0 on padding, each [B, R]: those named in `outputs`
        (flowrl.engines.train.model_outputs); None: "logprobs" (actor), "values" (critic) or "scores" (reward)."""
        ...

    def update(self, batch: TensorDict, loss_fn: LossFn, *, temperature: float = 1.0,
               mini_batch_size: int = 8, micro_batch_size: int = 8, epochs: int = 1,
               shuffle_seed: int | None = None, old_logprobs_from_current: bool = False) -> dict[str, float]:
        """One optimizer step per mini-batch per epoch; returns mean metrics.

        With `old_logprobs_from_current` each micro-batch's "old_logprobs" are
        its current logprobs, detached: exact when the update is a single
        optimizer step on fresh samples, and it saves the separate forward.
        """
        ...

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded parameters on CPU (collective when sharded)."""
        ...

    def named_full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Each state-dict entry unsharded on the engine's device, one at a time (collective when sharded)."""
        ...

    def weight_shards(self) -> Any:
        """This rank's shards for a sync that moves each rank only what it keeps (a
        flowrl.engines.weights.reshard_sync.WeightShards), or None where a sync must gather the full tensors."""
        ...

    def save(self, path: str) -> None: ...

    def load(self, path: str) -> None: ...

    def save_pretrained(self, path: str, tokenizer: Any = None) -> None:
        """The model as a Hugging Face folder (LoRA adapters merged); every rank gathers, rank 0 writes."""
        ...

    def save_adapter(self, folder: str) -> str:
        """The LoRA adapter in peft's format under `folder` (a rollout engine that serves adapters loads it);
        the folder written."""
        ...


class RolloutEngine(Protocol):
    """Generates responses for left-padded prompt rows; `tp_ranks`: the ranks one engine spans (tensor
    parallel; a pool of N ranks holds N / tp_ranks replicas)."""

    tp_ranks: int

    def generate(self, prompt_ids_BP: torch.Tensor, prompt_mask_BP: torch.Tensor,
                 params: SamplingParams, *, seed: int | None = None) -> TensorDict:
        """Returns TensorDict(response_ids [B, R], response_mask [B, R], rollout_logprobs [B, R],
        finish_reason [B]); R <= max_new_tokens."""
        ...

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None: ...

    def load_weight_stream(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Loads (name, tensor) pairs as they arrive (a weight transport's buckets), building no state dict."""
        ...

    def weight_sync(self, train: TrainEngine, timeout_s: float = SYNC_TIMEOUT_S) -> "WeightSync":
        """How the weights of `train` (a train engine in this process) reach this engine; a transfer between
        ranks that stops is a WeightSyncTimeout within `timeout_s` (sync.timeout_s)."""
        ...

    def close(self) -> None:
        """Releases what the engine holds beyond plain tensors (an inference server's process state); the
        run's end calls it, so nothing is left for a later garbage collection to tear down mid-run."""
        ...


class WeightSync(Protocol):
    """Moves the actor's current weights into the rollout engine."""

    def __call__(self, train: TrainEngine, rollout: RolloutEngine) -> None: ...


RewardFn = Callable[[list[str], list[Any]], list[float]]
"""Scores decoded responses against per-row task metadata (e.g. answers)."""
