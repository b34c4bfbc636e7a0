"""`flowrl_sdpa`: transformers' SDPA attention, with single-token decoding of grouped-query models done
without copying the KV cache once per query head.

With a KV cache and an attention mask, transformers' SDPA path under torch.compile repeats each key/value
head for its query heads (`repeat_kv`): for a 0.5B Qwen2 decoding 512 rows against a 384-token static cache
that is 17 GB of copies per step, most of the step. When one token is decoded, the query heads that share a
key/value head can instead stand in the query-length dimension ([B, H, 1, D] -> [B, G, H/G, D]); the mask
([B, 1, 1, L]) broadcasts over them and SDPA reads the cache once. Everything else (prefill, training) goes to
transformers' own `sdpa_attention_forward`. Registered through transformers' AttentionInterface.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "flowrl_sdpa"


def grouped_decode_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        **kwargs: Any) -> tuple[torch.Tensor, None]:
    batch, heads, q_length, dim = query.shape
    groups = key.shape[1]
    if q_length != 1 or groups == heads or dropout or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    query_BGND = query.reshape(batch, groups, heads // groups, dim)  # query head h uses key/value head h // (H/G)
    out_BGND = torch.nn.functional.scaled_dot_product_attention(query_BGND, key, value, attn_mask=attention_mask,
                                                                scale=scaling)
    return out_BGND.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, grouped_decode_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_grouped_decode(model: torch.nn.Module) -> None:
    """Switch an SDPA model to `flowrl_sdpa` (outputs unchanged; only grouped single-token decoding differs)."""
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(NAME)
