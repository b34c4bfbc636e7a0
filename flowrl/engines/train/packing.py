"""Packed sequences: a micro-batch's rows concatenated into one sequence, attention kept within each row.

The padded layout ([B, L], flowrl.engines.train.model_inputs) computes B x L tokens, most of them padding when
response lengths have a long tail; packed, a pass computes the rows' real tokens only. Each row's position
ids restart at 0, so rotary embeddings see what they see in the row alone, and each token attends to the
earlier tokens of its own row only (per-document causal attention), through transformers' own path:

- with no attention mask and position ids that restart, transformers finds the rows
  (masking_utils.find_packed_sequence_indices) and builds the mask its attention implementation takes: a
  block-diagonal causal bool mask for SDPA (what flowrl_sdpa runs on the CPU; its is_causal shortcut does not
  apply, the pattern is not plain causal), a FlexAttention BlockMask for "flex_attention", and variable-length
  flash attention (cu_seqlens from the position ids) for "flash_attention_2"/"_3";
- on CUDA under flowrl_sdpa, whose dense mask would cost N^2 for N packed tokens, the engine builds that
  pattern as a FlexAttention BlockMask itself (transformers' flex_attention_mask with its causal and packed
  sequence mask functions), and flowrl_sdpa hands a BlockMask to transformers' flex_attention_forward, which
  skips the blocks outside every row.

Outputs are gathered back to each row's response columns, so callers see [B, R] as from the padded layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from tensordict import TensorDict
from transformers.masking_utils import (and_masks, causal_mask_function, flex_attention_mask,
                                        packed_sequence_mask_function)

from flowrl.engines.hf.attention import NAME as FLOWRL_SDPA
from flowrl.engines.train.logprobs import full_logits_logprobs, token_logprobs
from flowrl.engines.train.model_outputs import gathered_columns
from flowrl.engines.sampling import RowSampling, apply_sampling


class PackedEngine(Protocol):
    """What packed_outputs reads of the train engine it computes for (flowrl.engines.train.hf_engine's
    HFTrainEngine): its kind, model, forward functions (compiled or not) and log-probability options."""

    kind: str
    model: torch.nn.Module
    model_fn: Callable[..., Any]  # the model's forward, compiled when the whole model is
    decoder_fn: Callable[..., Any] | None  # the decoder's, compiled; None: model.get_decoder()
    lora: Any
    logprob_chunk_tokens: int
    sharded: bool
    compiled: bool


@dataclass(frozen=True)
class Packed:
    """One micro-batch packed: ids and positions [1, N] of its real tokens, row by row; `index_BL` the packed
    position of each token of the padded [B, P + R] layout (a padding column: that of a real token near it)."""

    input_ids_1N: torch.Tensor
    position_ids_1N: torch.Tensor
    index_BL: torch.Tensor
    num_prompt: int

    @property
    def at_BR(self) -> torch.Tensor:
        """The packed position of each response token."""
        return self.index_BL[:, self.num_prompt:]

    @property
    def before_BR(self) -> torch.Tensor:
        """The packed position of the token before each response token: the one that predicts it."""
        return (self.at_BR - 1).clamp(min=0)

    def model_inputs(self, block_mask: bool) -> dict:
        """Keyword arguments of the model's (or its decoder's) forward; `block_mask`: pass the per-row causal
        pattern as a FlexAttention BlockMask, else leave it to transformers (no mask, restarting positions)."""
        inputs = dict(input_ids=self.input_ids_1N, position_ids=self.position_ids_1N, use_cache=False)
        if block_mask:
            inputs["attention_mask"] = document_block_mask(self.position_ids_1N)
        return inputs


def pack(mb: TensorDict) -> Packed:
    """The micro-batch (prompts left-padded, responses right-padded) packed into one sequence."""
    ids_BL = torch.cat([mb["prompt_ids"], mb["response_ids"]], dim=1)
    mask_BL = torch.cat([mb["prompt_mask"], mb["response_mask"]], dim=1).bool()
    if not mask_BL.any():  # rows with no token at all: pass one (its outputs are masked), not an empty sequence
        mask_BL[0, 0] = True
    positions_BL = mask_BL.long().cumsum(-1) - 1
    index_BL = (mask_BL.flatten().long().cumsum(0) - 1).clamp(min=0).view(mask_BL.shape)
    return Packed(ids_BL[mask_BL][None], positions_BL[mask_BL][None], index_BL, mb["prompt_ids"].shape[1])


def document_ids(position_ids_1N: torch.Tensor) -> torch.Tensor:
    """Which row each packed token belongs to (0, 1, ...): a new row wherever the position does not go up by
    one, as transformers' find_packed_sequence_indices counts them."""
    step = torch.diff(position_ids_1N, prepend=position_ids_1N[:, :1] - 1, dim=-1)
    return (step != 1).long().cumsum(-1)


def document_block_mask(position_ids_1N: torch.Tensor):
    """Causal attention within each packed row, as a FlexAttention BlockMask (transformers' mask functions)."""
    num_tokens = position_ids_1N.shape[1]
    mask_function = and_masks(causal_mask_function, packed_sequence_mask_function(document_ids(position_ids_1N)))
    return flex_attention_mask(batch_size=1, q_length=num_tokens, kv_length=num_tokens, mask_function=mask_function,
                               device=position_ids_1N.device)


def gather_BR(values_1N: torch.Tensor, index_BR: torch.Tensor) -> torch.Tensor:
    """values_1N[0] at each index: [1, N, ...] -> [B, R, ...]."""
    return values_1N[0][index_BR]


def packed_outputs(engine: PackedEngine, mb: TensorDict, sampling: RowSampling,
                   outputs: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """HFTrainEngine's outputs [B, R] of the (trimmed) micro-batch, computed packed: what its padded passes
    compute (flowrl.engines.train.hf_engine), from one sequence of the rows' real tokens."""
    packed = pack(mb)
    inputs = packed.model_inputs(block_mask=_wants_block_mask(engine, packed.input_ids_1N.device))
    response_ids, ids = mb["response_ids"], {column: mb[column] for column in gathered_columns(outputs)}
    temperature_N, truncation = sampling.per_token(response_ids.shape[1])
    if engine.kind in ("critic", "reward"):
        head_1N = engine.model_fn(**inputs).logits[..., 0]
        if engine.kind == "critic":  # the value of the state before each response token
            return {"values": gather_BR(head_1N, packed.before_BR).float()}
        return {"scores": gather_BR(head_1N, packed.at_BR).float()}  # the score after each response token
    if engine.logprob_chunk_tokens and not engine.sharded:
        decoder = engine.model.get_decoder() if engine.decoder_fn is None else engine.decoder_fn
        hidden_BRH = gather_BR(decoder(**inputs).last_hidden_state, packed.before_BR)
        return token_logprobs(hidden_BRH, engine.model.get_output_embeddings().weight, response_ids, temperature_N,
                              outputs, engine.logprob_chunk_tokens, compiled=engine.compiled, truncation=truncation,
                              ids=ids)
    # full logits (FSDP2 runs lm_head inside the root module's forward): only at the positions that predict
    before_BR = packed.before_BR
    logits_NV = engine.model_fn(**inputs, logits_to_keep=before_BR.flatten()).logits[0]
    logits_NV = apply_sampling(logits_NV, temperature_N, truncation, response_ids.reshape(-1))
    return full_logits_logprobs(logits_NV.view(*before_BR.shape, -1), response_ids, outputs, ids)


def _wants_block_mask(engine: PackedEngine, device: torch.device) -> bool:
    """On CUDA under flowrl_sdpa: a BlockMask, not the dense N x N mask transformers builds for SDPA."""
    base = engine.model.get_base_model() if engine.lora else engine.model
    return device.type == "cuda" and getattr(base.config, "_attn_implementation", None) == FLOWRL_SDPA


__all__ = ["PackedEngine", "Packed", "document_block_mask", "document_ids", "gather_BR", "pack", "packed_outputs"]
