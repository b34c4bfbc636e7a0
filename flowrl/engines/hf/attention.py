"""`flowrl_sdpa`: transformers' SDPA attention, with two changes that leave outputs as they are.

Single-token decoding of grouped-query models without copying the KV cache once per query head: with a KV
cache and an attention mask, transformers' SDPA path under torch.compile repeats each key/value head for its
query heads (`repeat_kv`); for a 0.5B Qwen2 decoding 512 rows against a 384-token static cache that is 17 GB
of copies per step, most of the step. When one token is decoded, the query heads that share a key/value head
can instead stand in the query-length dimension ([B, H, 1, D] -> [B, G, H/G, D]); the mask ([B, 1, 1, L])
broadcasts over them and SDPA reads the cache once.

No mask for plain causal attention over unpadded rows: transformers before 5.2x builds the [B, 1, L, L] mask
whenever torch.compile traces (it cannot read the padding mask there), which keeps SDPA off its flash kernel.
With no padding mask, a purely causal pattern and as many queries as keys, the mask is None here, traced or
not, and SDPA runs with is_causal. The train engine packs each row's tokens to its front so that this holds
(flowrl.engines.train.hf_engine). A FlexAttention BlockMask (packed rows on CUDA, flowrl.engines.train.packing) goes to
transformers' `flex_attention_forward`; everything else to its own `sdpa_attention_forward` and `sdpa_mask`.
Registered through transformers' AttentionInterface and AttentionMaskInterface.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.attention.flex_attention import BlockMask
from transformers import AttentionInterface
from transformers.integrations.flex_attention import flex_attention_forward
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, sdpa_mask

NAME = "flowrl_sdpa"


def grouped_decode_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        **kwargs: Any) -> tuple[torch.Tensor, None]:
    if isinstance(attention_mask, BlockMask):  # packed rows on CUDA (flowrl.engines.train.packing)
        return flex_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    batch, heads, q_length, dim = query.shape
    groups = key.shape[1]
    if q_length != 1 or groups == heads or dropout or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    query_BGND = query.reshape(batch, groups, heads // groups, dim)  # query head h uses key/value head h // (H/G)
    out_BGND = torch.nn.functional.scaled_dot_product_attention(query_BGND, key, value, attn_mask=attention_mask,
                                                                scale=scaling)
    return out_BGND.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def causal_or_none_mask(**kwargs: Any) -> torch.Tensor | None:
    """transformers' `sdpa_mask`, but None (SDPA's is_causal) for plain causal attention over unpadded rows
    with no cache, also while torch.compile traces."""
    q_offset, kv_offset = kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0)
    if (kwargs.get("attention_mask") is None and kwargs.get("allow_is_causal_skip", True)
            and kwargs.get("mask_function") is causal_mask_function and kwargs.get("local_size") is None
            and isinstance(q_offset, int) and isinstance(kv_offset, int) and q_offset == kv_offset == 0
            and kwargs.get("q_length") == kwargs.get("kv_length")):
        return None
    return sdpa_mask(**kwargs)


AttentionInterface.register(NAME, grouped_decode_sdpa)
AttentionMaskInterface.register(NAME, causal_or_none_mask)


def use_flowrl_sdpa(model: torch.nn.Module) -> None:
    """Switch an SDPA model (or the model under a peft wrapper) to `flowrl_sdpa`; other implementations stay."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(getattr(base, "config", None), "_attn_implementation", None) == "sdpa":  # any other module: as is
        base.set_attn_implementation(NAME)
