"""Packed logprobs against padded ones on the same rows, in fp32 and in bf16 (issue 26: "bf16 tolerance on GPU").

    python benchmarks/packing_agreement.py                      # CUDA: Qwen2.5-0.5B shape, FlexAttention BlockMask
    python benchmarks/packing_agreement.py --device cpu --tiny  # a smoke run (the CPU's dense block-diagonal mask)

One model with random weights, two workloads (every response at the cap; log-normal lengths, median a quarter of
the cap, as benchmarks/packing.py draws them). The reference is the padded pass in fp32. Per workload one JSON
line: the largest and the mean absolute logprob difference over response tokens of packed fp32, padded bf16 and
packed bf16 against it, and of packed bf16 against padded bf16. Packing is within bf16's tolerance when packed
bf16 is about as far from the fp32 reference as padded bf16 is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from forced_lengths import draw_lengths  # noqa: E402
from packing import build_engine, workload_batch  # noqa: E402


def logprobs(engine, batch, packing: bool, micro_batch_size: int) -> torch.Tensor:
    engine.packing = packing
    return engine.forward(batch, micro_batch_size=micro_batch_size)["logprobs"].float().cpu()


def gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    diff = (a - b).abs()[mask.bool()]
    return {"max": round(diff.max().item(), 6), "mean": round(diff.mean().item(), 7)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="a tiny model of the same architecture, short rows")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=None, help="the cap (default 1024; --tiny 64)")
    p.add_argument("--prompt-len", type=int, default=None, help="default 256; --tiny 16")
    p.add_argument("--micro-batch-size", type=int, default=4)
    args = p.parse_args()
    cap = args.new_tokens or (64 if args.tiny else 1024)
    args.prompt_len = args.prompt_len or (16 if args.tiny else 256)
    args.new_tokens, args.dtype, args.compile, args.logprob_chunk_tokens = [cap], "float32", False, 4096
    engine, shape = build_engine(args)
    batches = {"fixed": workload_batch(args.rows, args.prompt_len, [cap] * args.rows, shape.vocab_size),
               "long_tail": workload_batch(args.rows, args.prompt_len, draw_lengths(args.rows, cap, 1.0, seed=cap),
                                           shape.vocab_size)}
    fp32 = {name: (logprobs(engine, b, False, args.micro_batch_size), logprobs(engine, b, True, args.micro_batch_size))
            for name, b in batches.items()}
    engine.model.to(torch.bfloat16)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    for name, batch in batches.items():
        reference, packed32 = fp32[name]
        padded16 = logprobs(engine, batch, False, args.micro_batch_size)
        packed16 = logprobs(engine, batch, True, args.micro_batch_size)
        mask = batch["response_mask"]
        print(json.dumps({"workload": name, "device": device, "rows": args.rows, "cap": cap,
                          "response_tokens": int(mask.sum()),
                          "packed_fp32_vs_padded_fp32": gap(packed32, reference, mask),
                          "padded_bf16_vs_padded_fp32": gap(padded16, reference, mask),
                          "packed_bf16_vs_padded_fp32": gap(packed16, reference, mask),
                          "packed_bf16_vs_padded_bf16": gap(packed16, padded16, mask)}), flush=True)


if __name__ == "__main__":
    main()
