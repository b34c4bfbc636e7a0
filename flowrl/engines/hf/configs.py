"""The transformers engines' configs: `roles.actor.engine=hf`, `roles.critic.engine=hf`, `roles.rollout.engine=hf`."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing, checkpoint_wrapper)

from flowrl.engines import memory
from flowrl.engines.configs import Head, ModelSource
from flowrl.engines.hf.options import DTYPES, HFRolloutOptions, HFStaticRolloutOptions, HFTrainOptions
from flowrl.engines.models.folders import load_causal_lm, load_value_model
from flowrl.engines.hf.rollout import HFRolloutEngine
from flowrl.engines.hf.static import StaticCacheRolloutEngine
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.train import lora
from flowrl.engines.protocols import TrainEngine


class HFTrainConfig(HFTrainOptions):
    """The options and what builds HFTrainEngine from them and estimates its memory."""

    def build(self, source: ModelSource, *, head: Head, device: str, trainable: bool = True,
              base_of: TrainEngine | None = None) -> HFTrainEngine | lora.BaseModelEngine:
        """`base_of`: a trained engine in this process whose starting weights a frozen engine may read instead
        of loading them: under LoRA, its module with the adapters disabled."""
        if not trainable and head == "actor" and isinstance(base_of, HFTrainEngine) and base_of.lora:
            return lora.BaseModelEngine(base_of)
        dtype = DTYPES[source.dtype]
        model = load_causal_lm(source.path, dtype) if head == "actor" else load_value_model(source.path, dtype)
        if not trainable:  # its passes' options only: no offload, no adapters
            frozen = self.model_copy(update=dict(offload_params=False, offload_optimizer=False, lora_rank=0))
            return HFTrainEngine(model.requires_grad_(False), frozen, kind=head, device=device)
        if source.gradient_checkpointing:
            _checkpoint_layers(model)
        self._check_offload(head, device)
        if self.lora_rank:
            if head != "actor":
                raise ValueError(f"{head}.lora_rank={self.lora_rank}: LoRA is for the actor; set it to 0")
            model = lora.apply(model, self.lora_rank, self.lora_alpha, self.lora_target_modules,
                               f"{head}.lora_target_modules")
        return HFTrainEngine(model, self, kind=head, device=device)

    def estimate_memory(self, shape: memory.ModelShape, load: memory.RankLoad, *, trainable: bool = True,
                        base_lent: bool = False) -> dict[str, int]:
        """With LoRA only the adapters have gradients and AdamW moments; `offload_params` (FSDP2 CPU offload)
        keeps shards, gradients and optimizer state in CPU memory and the GPU holds the unsharded root
        (embeddings, lm_head) and two decoder layers at a time (the one computing and the one prefetched);
        `offload_optimizer` brings AdamW's moments to the GPU for the optimizer step only, when activations
        and logits are freed, so only what they exceed those by counts; logits are live
        `logprob_chunk_tokens` at a time. A token budget bounds one micro-batch's tokens (a longer row runs
        alone), whatever the row count."""
        budget = self.max_tokens_per_micro_batch if trainable else \
            self.forward_max_tokens_per_micro_batch or self.max_tokens_per_micro_batch
        if budget:
            load = dataclasses.replace(load, tokens=max(budget, load.seq_len))
        if not trainable:
            return memory.frozen(shape, load, holds_weights=not base_lent)
        adapters = shape.lora_params(self.lora_rank, tuple(self.lora_target_modules)) if self.lora_rank else None
        parts = memory.trained(shape, load, trained_params=adapters, logit_tokens=self.logprob_chunk_tokens or None,
                               compiled=self.compile)
        if self.offload_params:
            on_gpu = (shape.embedding_params() + 2 * shape.layer_params()) * shape.dtype_bytes
            trained = (adapters or shape.num_params) * shape.dtype_bytes
            return {**parts, "weights": on_gpu, "gradients": on_gpu * trained // shape.weight_bytes, "optimizer": 0}
        if self.offload_optimizer:
            parts["optimizer"] = max(0, parts["optimizer"] - parts["activations"] - parts["logits"])
        return parts

    def lends_base(self) -> bool:
        """Under LoRA a frozen engine on the same base (the reference) is this module with the adapters off."""
        return self.lora_rank > 0

    def _check_offload(self, head: str, device: str) -> None:
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if self.offload_params and world == 1 and device != "cpu":
            raise ValueError(f"{head}.offload_params: needs FSDP2, which flowrl applies over 2 or more ranks "
                             f"(torchrun); with one process set it false (or use {head}.offload_optimizer)")
        for name in ("offload_params", "offload_optimizer"):
            if getattr(self, name) and device == "cpu":
                warnings.warn(f"{head}.{name} has no effect on the CPU: the engine's memory is CPU memory already",
                              stacklevel=3)
        if self.offload_params and self.offload_optimizer:
            warnings.warn(f"{head}.offload_optimizer has no effect: {head}.offload_params keeps the optimizer "
                          f"state on the CPU already", stacklevel=3)



class HFRolloutConfig(HFRolloutOptions):
    def build(self, source: ModelSource, *, tokenizer: Any, device: str,
              share: TrainEngine | None = None) -> HFRolloutEngine:
        model = share.model if isinstance(share, HFTrainEngine) else load_causal_lm(source.path, DTYPES[source.dtype])
        return HFRolloutEngine(model, tokenizer, self, device=device)


class HFStaticRolloutConfig(HFStaticRolloutOptions):
    """`roles.rollout.engine=hf_static`: a static KV cache and one compiled decode step (a CUDA graph on GPUs)."""

    def build(self, source: ModelSource, *, tokenizer: Any, device: str,
              share: TrainEngine | None = None) -> StaticCacheRolloutEngine:
        model = share.model if isinstance(share, HFTrainEngine) else load_causal_lm(source.path, DTYPES[source.dtype])
        return StaticCacheRolloutEngine(model, tokenizer, self, device=device)


def _checkpoint_layers(model: torch.nn.Module) -> None:
    """Each decoder layer recomputes its activations in backward (model.gradient_checkpointing).

    torch's checkpoint wrapper (what FSDP2 setups use) rather than transformers' switch, whose name
    differs across transformers 5 releases; state-dict keys stay unchanged.
    """
    layers = set(model.model.layers)
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                   check_fn=lambda module: module in layers)
