"""The transformers engines' configs: `actor.engine=hf`, `critic.engine=hf`, `rollout.engine=hf`."""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing, checkpoint_wrapper)

from flowrl.engines.configs import Head, ModelSource, RolloutEngineConfig, TrainEngineConfig
from flowrl.engines.hf_models import load_causal_lm, load_value_model
from flowrl.engines.hf_rollout import HFRolloutEngine
from flowrl.engines.hf_static import StaticCacheRolloutEngine
from flowrl.engines.hf_train import HFTrainEngine
from flowrl.engines.lr_schedules import check_schedule
from flowrl.engines.protocols import TrainEngine

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


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
    compile: bool = Field(False, description="torch.compile the decoder and the log-probability chunks for "
                                             "this engine's passes (fused norms, rotary, activations and "
                                             "log-softmax; fewer saved activations). The module itself stays "
                                             "uncompiled, so a rollout engine sharing it keeps its own graph.")

    def build(self, source: ModelSource, *, head: Head, device: str, trainable: bool = True) -> HFTrainEngine:
        dtype = DTYPES[source.dtype]
        model = load_causal_lm(source.path, dtype) if head == "actor" else load_value_model(source.path, dtype)
        chunk = dict(logprob_chunk_tokens=self.logprob_chunk_tokens, compile=self.compile)
        if not trainable:
            return HFTrainEngine(model.requires_grad_(False), kind=head, device=device, **chunk)
        if source.gradient_checkpointing:
            _checkpoint_layers(model)
        return HFTrainEngine(model, kind=head, lr=self.lr, weight_decay=self.weight_decay, grad_clip=self.grad_clip,
                             warmup_steps=self.warmup_steps, device=device, lr_schedule=self.lr_schedule,
                             lr_decay_steps=self.lr_decay_steps, **chunk)

    @model_validator(mode="after")
    def _decays(self) -> "HFTrainConfig":
        check_schedule(self.lr_schedule, self.warmup_steps, self.lr_decay_steps)
        return self


class HFRolloutConfig(RolloutEngineConfig):
    micro_batch_size: int = Field(256, ge=1, description="Rows per transformers generate() call.")

    def build(self, source: ModelSource, *, tokenizer: Any, device: str,
              share: TrainEngine | None = None) -> HFRolloutEngine:
        model = share.model if isinstance(share, HFTrainEngine) else load_causal_lm(source.path, DTYPES[source.dtype])
        return HFRolloutEngine(model, tokenizer, device=device, micro_batch_size=self.micro_batch_size)


class HFStaticRolloutConfig(RolloutEngineConfig):
    """`rollout.engine=hf_static`: a static KV cache and one compiled decode step (a CUDA graph on GPUs)."""

    compile: bool | None = Field(None, description="torch.compile the decode step (CUDA graphs); None: on CUDA "
                                                   "devices only.")

    def build(self, source: ModelSource, *, tokenizer: Any, device: str,
              share: TrainEngine | None = None) -> StaticCacheRolloutEngine:
        model = share.model if isinstance(share, HFTrainEngine) else load_causal_lm(source.path, DTYPES[source.dtype])
        compile = self.compile if self.compile is not None else device.startswith("cuda")
        return StaticCacheRolloutEngine(model, tokenizer, device=device, compile=compile)


def _checkpoint_layers(model: torch.nn.Module) -> None:
    """Each decoder layer recomputes its activations in backward (model.gradient_checkpointing).

    torch's checkpoint wrapper (what FSDP2 setups use) rather than transformers' switch, whose name
    differs across transformers 5 releases; state-dict keys stay unchanged.
    """
    layers = set(model.model.layers)
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                   check_fn=lambda module: module in layers)
