"""A fake tensor-parallel vLLM engine: what each tensor rank's parameters hold after vLLM's loaders read a
Hugging Face Qwen2/Llama checkpoint, transcribed from vLLM 0.32's loaders (not from flowrl's plan):

- QKVParallelLinear.weight_loader (linear.py): per rank num_heads / tp query heads and max(1, kv / tp)
  key-value heads, replicated tp / kv times when kv < tp; shard "q" at offset 0, "k" after the queries, "v"
  after the keys; `start_idx = shard_rank * shard_size`, shard_rank = tp_rank for q and
  tp_rank // num_kv_head_replicas for k and v; `loaded_weight.narrow(output_dim, start_idx, shard_size)`.
- MergedColumnParallelLinear.weight_loader: gate (shard 0) then up (shard 1), each narrowed by
  `tp_rank * shard_size` along the output dim.
- RowParallelLinear.weight_loader: `narrow(input_dim, tp_rank * shard_size, shard_size)`; a bias whole.
- VocabParallelEmbedding / ParallelLMHead.weight_loader (vocab_parallel_embedding.py): the vocabulary padded
  to a multiple of 64, `num_embeddings_per_partition = padded / tp`; `org_vocab_start_index = tp_rank *
  per_partition`, end min(start + per_partition, vocab); rows [0, end - start) copied, the rest filled with 0.
- Everything else (norms): copied whole.
"""

from __future__ import annotations

import torch

PAD = 64


def vllm_params(tensors: dict[str, torch.Tensor], tp: int, tp_rank: int, num_heads: int,
                num_kv_heads: int) -> dict[str, torch.Tensor]:
    """This tensor rank's vLLM parameters (vLLM's names) loaded from (name, tensor) pairs as vLLM reads them."""
    out: dict[str, torch.Tensor] = {}
    stacked: dict[str, dict[str, torch.Tensor]] = {}
    for name, loaded in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        module = prefix.rpartition(".")[2]
        owner = prefix.rpartition(".")[0]
        if module in ("q_proj", "k_proj", "v_proj"):
            stacked.setdefault(f"{owner}.qkv_proj.{leaf}", {})[module[0]] = loaded
        elif module in ("gate_proj", "up_proj"):
            stacked.setdefault(f"{owner}.gate_up_proj.{leaf}", {})[module] = loaded
        elif module in ("o_proj", "down_proj") and leaf == "weight":
            size = loaded.shape[1] // tp
            out[name] = loaded.narrow(1, tp_rank * size, size).clone()
        elif module in ("embed_tokens", "lm_head"):
            out[name] = _vocab(loaded, tp, tp_rank)
        else:
            out[name] = loaded.clone()
    for name, parts in stacked.items():
        if "q" in parts:
            out[name] = torch.cat([_qkv(parts[key], key, tp, tp_rank, num_heads, num_kv_heads) for key in "qkv"])
        else:
            out[name] = torch.cat([_column(parts[key], tp, tp_rank) for key in ("gate_proj", "up_proj")])
    return out


def _column(loaded: torch.Tensor, tp: int, tp_rank: int) -> torch.Tensor:
    size = loaded.shape[0] // tp
    return loaded.narrow(0, tp_rank * size, size)


def _qkv(loaded: torch.Tensor, shard: str, tp: int, tp_rank: int, num_heads: int, num_kv: int) -> torch.Tensor:
    head_size = loaded.shape[0] // (num_heads if shard == "q" else num_kv)
    if shard == "q":
        size, shard_rank = num_heads // tp * head_size, tp_rank
    else:
        replicas = max(1, tp // num_kv)
        size, shard_rank = max(1, num_kv // tp) * head_size, tp_rank // replicas
    return loaded.narrow(0, shard_rank * size, size)


def _vocab(loaded: torch.Tensor, tp: int, tp_rank: int) -> torch.Tensor:
    vocab = loaded.shape[0]
    per_partition = -(-vocab // PAD) * PAD // tp
    start = tp_rank * per_partition
    end = min(start + per_partition, vocab)
    param = torch.empty(per_partition, *loaded.shape[1:], dtype=loaded.dtype)
    chunk = loaded.narrow(0, min(start, vocab), max(end - start, 0))
    param[:chunk.shape[0]].copy_(chunk)
    param[chunk.shape[0]:].fill_(0)
    return param
