"""What the benchmark scripts share: the model, a synthetic batch and a wall-clock timer that syncs CUDA."""

from __future__ import annotations

import time
from typing import Callable

import torch
from tensordict import TensorDict

from flowrl.data.batch import prompt_batch
from flowrl.engines.tiny_model import build_tiny_model


def bench_model(folder: str, device: str, max_positions: int):
    """The benchmark model: 12 layers of width 1024 on CUDA (about 150M parameters), the tiny one on CPU."""
    big = device == "cuda"
    return build_tiny_model(folder + "/m", hidden_size=1024 if big else 64, num_layers=12 if big else 2,
                            num_heads=16 if big else 4, max_position_embeddings=max_positions)


def make_batch(rows: int, prompt_len: int, response_len: int, vocab: int) -> TensorDict:
    """Random prompts and full-length responses, with one advantage per row."""
    gen = torch.Generator().manual_seed(0)
    batch = prompt_batch(torch.randint(2, vocab, (rows, prompt_len), generator=gen).tolist(), 0, range(rows))
    batch["response_ids"] = torch.randint(2, vocab, (rows, response_len), generator=gen)
    batch["response_mask"] = torch.ones(rows, response_len, dtype=torch.long)
    batch["advantages"] = torch.randn(rows, 1, generator=gen).expand(rows, response_len).contiguous()
    return batch


def seconds_per_call(fn: Callable[[], object], device: str, repeats: int = 3, warmup: int = 2) -> float:
    """Mean seconds of fn() after `warmup` calls (kernels, allocator, optimizer state)."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats
