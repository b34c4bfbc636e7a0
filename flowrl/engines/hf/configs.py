"""The transformers engines' configs: `roles.actor.engine=hf`, `roles.critic.engine=hf`, `roles.rollout.engine=hf`."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import Field, model_validator
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing, checkpoint_wrapper)

from flowrl.engines import memory
from flowrl.engines.configs import Head, ModelSource, RolloutEngineConfig, TrainEngineConfig
from flowrl.engines.models.folders import load_causal_lm, load_value_model
from flowrl.engines.hf.rollout import HFRolloutEngine
from flowrl.engines.hf.static import StaticCacheRolloutEngine
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.train import lora
from flowrl.engines.train.lr_schedules import check_schedule
from flowrl.engines.protocols import TrainEngine

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class HFTrainConfig(TrainEngineConfig):
    lr: float = Field(2e-3, gt=0, description="AdamW learning rate (the default suits the tiny model; "
                                              "use about 1e-6 for real LLMs).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")
    warmup_steps: int = Field(0, ge=0, description="Linear LR warmup, in optimizer steps.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field("constant", description="After the warmup: "
                                                                "constant LR, or linear or cosine decay to 0.")
    lr_decay_steps: int = Field(0, ge=0, description="Optimizer steps (warmup included) at which a linear or "
                                                      "cosine schedule reaches 0.")
    logprob_chunk_tokens: int = Field(4096, ge=0, description="Log-probabilities from the lm_head this many "
                                                              "tokens at a time, never the full fp32 logits "
                                                              "(0: full logits).")
    compile: bool = Field(False, description="torch.compile each decoder layer (one compile serves them all; "
                                             "FSDP2: the whole model) and the log-probability chunks for this "
                                             "engine's passes (fused norms, rotary, activations and log-softmax; "
                                             "fewer saved activations). The module is compiled only while the "
                                             "passes run, so a rollout engine sharing it keeps its own graph.")
    max_tokens_per_micro_batch: int = Field(0, ge=0, description="Group an update's rows into micro-batches of "
                                            "at most this many tokens per rank (verl's ppo_max_token_len_per_gpu; "
                                            "packed: real tokens, padded: rows x longest row; a longer row runs "
                                            "alone), balanced by Karmarkar-Karp, in place of "
                                            "train.micro_batch_size rows; the step's gradient is the same. 0: rows.")
    forward_max_tokens_per_micro_batch: int = Field(0, ge=0, description="The same for no-grad passes (old and "
                                                    "reference logprobs, values), in place of "
                                                    "train.forward_micro_batch_size rows; 0: "
                                                    "max_tokens_per_micro_batch.")
    packing: bool = Field(False, description="Run each micro-batch's rows as one sequence of their real tokens, "
                          "position ids restarting per row and attention within each row (transformers' packed "
                          "sequence masks; a FlexAttention block mask on CUDA), instead of rows padded to the "
                          "longest: no compute on padding. Outputs equal the padded ones to float rounding.")

    offload_params: bool = Field(False, description="FSDP2 CPU offload: the sharded parameters, their gradients "
                                 "and AdamW's state live in CPU memory and the optimizer step runs there; each "
                                 "layer is copied to the GPU while it computes (needs 2 or more ranks off the CPU).")
    offload_optimizer: bool = Field(False, description="AdamW's state waits in CPU memory between optimizer steps "
                                    "(verl's optimizer offload): the GPU holds it during the step only.")
    lora_rank: int = Field(0, ge=0, description="LoRA adapters of this rank on lora_target_modules (peft: "
                           "`pip install -e '.[lora]'`); only they train, checkpoint and sync, and the reference "
                           "policy is the same module with them disabled. 0: full fine-tuning (actor only).")
    lora_alpha: float = Field(16.0, gt=0, description="LoRA scale: an adapter adds lora_alpha / lora_rank * B @ A.")
    lora_target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS), description="Names of the "
                                           "linear layers that get LoRA adapters (the attention and MLP "
                                           "projections of Llama and Qwen models).")

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

    @model_validator(mode="after")
    def _decays(self) -> "HFTrainConfig":
        check_schedule(self.lr_schedule, self.warmup_steps, self.lr_decay_steps)
        return self


class HFRolloutConfig(RolloutEngineConfig):
    micro_batch_size: int = Field(256, ge=1, description="Rows per transformers generate() call.")

    def build(self, source: ModelSource, *, tokenizer: Any, device: str,
              share: TrainEngine | None = None) -> HFRolloutEngine:
        model = share.model if isinstance(share, HFTrainEngine) else load_causal_lm(source.path, DTYPES[source.dtype])
        return HFRolloutEngine(model, tokenizer, self, device=device)


class HFStaticRolloutConfig(RolloutEngineConfig):
    """`roles.rollout.engine=hf_static`: a static KV cache and one compiled decode step (a CUDA graph on GPUs)."""

    compile: bool | None = Field(None, description="torch.compile the decode step (CUDA graphs); None: on CUDA "
                                                   "devices only.")

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
