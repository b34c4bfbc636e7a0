"""How often the static-cache engine's decode step compiles over the shapes of a run, and the seconds of each
call (cold: the torch.compile caches start empty unless TORCHINDUCTOR_CACHE_DIR names a used folder).

The calls are a GRPO run's: a greedy evaluation of 200 rows, sampled rollouts of 512 rows with long-tailed
lengths (`eos_at_B`: about half the rows end within new_tokens / 6 tokens), so that finished rows are
compacted into 256, 128, 64 and 32 rows, prompts of another width (another cache length), and evaluations
of other sizes. Each call prints a JSON line: its seconds, the graphs dynamo compiled during it
(`new_graphs`) and the (rows, length) shapes held. `TORCH_LOGS=recompiles` prints why each recompile
happened. Measured: tiny model on CPU, 64 new tokens, cold caches: 2 compiles (one greedy, one sampled),
where torch.compile's default compiled 4 (static, dynamic rows, dynamic length, sampled); Qwen2.5-0.5B shape
on an H200, 256 new tokens, after the fix: 2 compiles, the greedy evaluation's first call 49.6 s and the
first rollout 46.8 s, later calls 0.5-1.2 s; with the step compiled per decoder layer (flowrl.engines.
decode_regions, 2026-12-04): 2 graphs (a layer, sampling) for all calls, the first call 15.1 s, later calls
0.6-1.9 s.

    PYTHONPATH=. python benchmarks/decode_compiles.py --device cuda
    PYTHONPATH=. python benchmarks/decode_compiles.py --device cpu --new-tokens 64   # tiny model
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import QWEN05B, SMALL, qwen_model  # noqa: E402
from flowrl.engines.hf.configs import HFStaticRolloutConfig
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer  # noqa: E402
from flowrl.engines.hf.static import StaticCacheRolloutEngine  # noqa: E402
from flowrl.engines.protocols import SamplingParams  # noqa: E402

CALLS = [("eval", 200, 40, True), ("rollout", 512, 30, False), ("rollout", 512, 50, False),
         ("rollout", 512, 30, False), ("eval", 200, 40, True), ("eval", 56, 40, True), ("eval", 200, 70, True)]
"""(name, rows, prompt width, greedy) of each call, in order."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--new-tokens", type=int, default=256)
    args = p.parse_args()
    big = args.device == "cuda"
    dtype = torch.bfloat16 if big else torch.float32
    folder = qwen_model(tempfile.mkdtemp() + "/m", "0123456789+-*= ", QWEN05B if big else SMALL, 1024, dtype)
    tokenizer, model = load_tokenizer(folder), load_causal_lm(folder, dtype).to(args.device)
    engine = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=True), device=args.device)
    gen = torch.Generator().manual_seed(0)
    counters = torch._dynamo.utils.counters["stats"]
    for name, rows, width, greedy in CALLS:
        ids = torch.randint(2, 17, (rows, width), generator=gen)
        eos_at = (torch.empty(rows).exponential_(6 / args.new_tokens, generator=gen).long() + 1)
        params = SamplingParams(max_new_tokens=args.new_tokens, greedy=greedy)
        graphs, start = counters["unique_graphs"], time.perf_counter()
        engine.generate(ids, torch.ones_like(ids), params, seed=0, eos_at_B=eos_at)
        if big:
            torch.cuda.synchronize()
        print(json.dumps({"call": name, "rows": rows, "width": width, "seconds": round(time.perf_counter() - start, 2),
                          "new_graphs": counters["unique_graphs"] - graphs, "shapes": sorted(engine._caches)}),
              flush=True)


if __name__ == "__main__":
    main()
