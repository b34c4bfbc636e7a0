"""What the benchmark scripts share: the model, a synthetic batch and a wall-clock timer that syncs CUDA."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from tensordict import TensorDict

from flowrl.data.batch import prompt_batch
from flowrl.engines.models.tiny_model import build_tiny_model


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


QWEN05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
               intermediate_size=4864, vocab_size=151936)
"""The shape of Qwen2.5-0.5B (the workload of shared/PERF_NOTES.md)."""
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             intermediate_size=256, vocab_size=512)
"""A tiny model of the same architecture, for CPU smoke runs (head_dim 32: vLLM's CPU attention has no smaller)."""


def full_vocab_tokenizer(chars: str, vocab_size: int):
    """One token per character of `chars` after "<pad>" = 0 and "<eos>" = 1, padded with filler tokens up to
    `vocab_size`, so every id the model samples decodes (to "<|id|>")."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{ch: i + 2 for i, ch in enumerate(chars)}}
    vocab.update({f"<|{i}|>": i for i in range(len(vocab), vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                   padding_side="left")


def qwen_model(folder: str, chars: str, shape: dict, max_positions: int, dtype: torch.dtype,
               device: str = "cpu") -> str:
    """A random-weight Qwen2 checkpoint (sdpa, tied embeddings unless `shape` says otherwise) plus tokenizer
    saved to `folder`; returns it. device="cuda" draws the weights there (a 7B shape in seconds instead of the
    minutes its fp32 init takes on the CPU; other values than the CPU's draw, from the same seed)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = full_vocab_tokenizer(chars, shape["vocab_size"])
    config = Qwen2Config(**{"tie_word_embeddings": True, **shape}, max_position_embeddings=max_positions,
                         rope_theta=1e6, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, attn_implementation="sdpa")
    with torch.random.fork_rng(devices=[] if device == "cpu" else [torch.device(device)]), torch.device(device):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def alias_algorithms() -> None:
    """Make `flowrl.algorithms` importable from a plain checkout on PYTHONPATH (no pip install): pyproject maps
    that name to the top-level algorithms/ folder, which only an install sets up."""
    try:
        importlib.import_module("flowrl.algorithms")
        return
    except ModuleNotFoundError as err:
        if err.name != "flowrl.algorithms":
            raise
    import flowrl

    folder = Path(__file__).resolve().parents[1] / "algorithms"
    spec = importlib.util.spec_from_file_location("flowrl.algorithms", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["flowrl.algorithms"] = flowrl.algorithms = module
    spec.loader.exec_module(module)
