"""The transformers engines' options, the fields only: the engines take these (flowrl.engines.hf.configs adds
each one's `build()`, which constructs its engine, so an engine module never imports the module that builds it)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from flowrl.engines.configs import RolloutEngineConfig, TrainEngineConfig
from flowrl.engines.train.lr_schedules import check_schedule

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class HFTrainOptions(TrainEngineConfig):
    """`roles.<actor|critic|reward_model|ref>.*` under engine=hf (HFTrainEngine takes these)."""

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
                                            "alone), balanced by Karmarkar-Karp, in place of the role's "
                                            "micro_batch_size rows; the step's gradient is the same. 0: rows.")
    forward_max_tokens_per_micro_batch: int = Field(0, ge=0, description="The same for no-grad passes (old and "
                                                    "reference logprobs, values), in place of "
                                                    "the role's forward_micro_batch_size rows; 0: "
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

    @model_validator(mode="after")
    def _decays(self) -> "HFTrainOptions":
        check_schedule(self.lr_schedule, self.warmup_steps, self.lr_decay_steps)
        return self


class HFRolloutOptions(RolloutEngineConfig):
    """`roles.rollout.*` under engine=hf (HFRolloutEngine takes these)."""

    micro_batch_size: int = Field(256, ge=1, description="Rows per transformers generate() call.")


class HFStaticRolloutOptions(RolloutEngineConfig):
    """`roles.rollout.engine=hf_static`: a static KV cache and one compiled decode step (a CUDA graph on GPUs)."""

    compile: bool | None = Field(None, description="torch.compile the decode step (CUDA graphs); None: on CUDA "
                                                   "devices only.")
