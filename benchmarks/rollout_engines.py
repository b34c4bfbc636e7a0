"""Rollout engines and logprob paths side by side, on the GRPO workload of shared/PERF_NOTES.md.

    python benchmarks/rollout_engines.py cuda      # Qwen2.5-0.5B shape, 512 rows, 128 + 256 tokens, bf16
    python benchmarks/rollout_engines.py cpu       # a tiny model, for a smoke run

Prints tokens per second of `roles.rollout.engine=hf` (generate, 256 and all rows per call) and `hf_static`
(static KV cache, one compiled decode step), how far each engine's sampler logprobs are from the train
engine's, and time and peak memory of logprobs forward+backward with full fp32 logits vs chunked.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import QWEN05B, SMALL, qwen_model  # noqa: E402

from flowrl.engines.hf.configs import HFRolloutConfig, HFStaticRolloutConfig, HFTrainConfig
from flowrl.data.batch import prompt_batch  # noqa: E402
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer  # noqa: E402
from flowrl.engines.hf.rollout import HFRolloutEngine  # noqa: E402
from flowrl.engines.hf.static import StaticCacheRolloutEngine  # noqa: E402
from flowrl.engines.train.hf_engine import HFTrainEngine  # noqa: E402
from flowrl.engines.protocols import SamplingParams  # noqa: E402


def timed(fn, device):
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return out, time.perf_counter() - start, peak


def rollout(name, engine, batch, params, device, repeats):
    """(tokens/s of the last call, first-call seconds, the last output)."""
    out, first, _ = timed(lambda: engine.generate(batch["prompt_ids"], batch["prompt_mask"], params, seed=0), device)
    for i in range(repeats):
        out, seconds, _ = timed(lambda: engine.generate(batch["prompt_ids"], batch["prompt_mask"], params, seed=i),
                                device)
    tokens = int(out["response_mask"].sum())
    print(f"{name:34s} {tokens / seconds:10.0f} tok/s   first call {first:6.1f} s   {seconds:6.2f} s/call", flush=True)
    return tokens / seconds, out


def mismatch(name, train, batch, out):
    batch = batch.clone()
    batch["response_ids"], batch["response_mask"] = out["response_ids"], out["response_mask"]
    trained = train.forward(batch, temperature=1.0, micro_batch_size=64)["logprobs"]
    mask = out["response_mask"].bool()
    diff = (trained - out["rollout_logprobs"])[mask].abs()
    print(f"{name:34s} sampler vs trainer logprobs: mean |diff| {diff.mean():.2e}  max {diff.max():.2e}  "
          f"(ignore_eos: eos left out of the sampler)", flush=True)


def logprob_pass(train, batch, micro, device):
    def run():
        for mb in batch.split(micro):
            out = train._outputs(mb.to(train.device), 1.0, False)
            out["logprobs"].sum().backward()
        train.model.zero_grad(set_to_none=True)
    run()
    _, seconds, peak = timed(run, device)
    return seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("device", choices=["cpu", "cuda"])
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    args = parser.parse_args()
    big = args.device == "cuda"
    rows, prompt_len = args.rows or (512 if big else 16), 128 if big else 8
    new = args.new_tokens or (256 if big else 16)
    dtype = torch.bfloat16 if big else torch.float32
    folder = qwen_model(tempfile.mkdtemp() + "/m", "0123456789+=", QWEN05B if big else SMALL, 2048, dtype)
    tok, model = load_tokenizer(folder), load_causal_lm(folder, dtype)
    gen = torch.Generator().manual_seed(0)
    vocab = (QWEN05B if big else SMALL)["vocab_size"]
    batch = prompt_batch(torch.randint(2, vocab, (rows, prompt_len), generator=gen).tolist(), 0, range(rows))
    params = SamplingParams(max_new_tokens=new, temperature=1.0, ignore_eos=True)
    print(f"{rows} rows x ({prompt_len} prompt + {new} new) tokens on {args.device} "
          f"({torch.cuda.get_device_name() if big else 'cpu'})", flush=True)
    train = HFTrainEngine(model, HFTrainConfig(logprob_chunk_tokens=4096), kind="actor", device=args.device)
    hf256, _ = rollout("hf generate, 256 rows a call", HFRolloutEngine(model, tok, HFRolloutConfig(micro_batch_size=256), device=args.device), batch, params,
                       args.device, 1)
    hf_all, out_hf = rollout("hf generate, all rows in one call", HFRolloutEngine(model, tok, HFRolloutConfig(micro_batch_size=rows), device=args.device),
                             batch, params, args.device, 1)
    static, out_static = rollout("hf_static (compiled step)", StaticCacheRolloutEngine(model, tok, HFStaticRolloutConfig(compile=big), device=args.device),
                                 batch, params, args.device, 2)
    print(f"hf_static / hf(256 a call) = {static / hf256:.2f}x   hf_static / hf(one call) = {static / hf_all:.2f}x")
    mismatch("hf", train, batch, out_hf)
    mismatch("hf_static", train, batch, out_static)
    full = batch.clone()
    full["response_ids"], full["response_mask"] = out_static["response_ids"], out_static["response_mask"]
    for micro in (64, 32):
        train.logprob_chunk_tokens = 0
        s_full, m_full = logprob_pass(train, full, micro, args.device)
        train.logprob_chunk_tokens = 4096
        s_chunk, m_chunk = logprob_pass(train, full, micro, args.device)
        print(f"logprobs fwd+bwd, micro-batch {micro}: full logits {s_full:.2f} s / {m_full:.1f} GiB, "
              f"chunked {s_chunk:.2f} s / {m_chunk:.1f} GiB: memory {m_full / m_chunk:.2f}x less, "
              f"time {s_chunk / s_full:.2f}x", flush=True)


if __name__ == "__main__":
    main()
