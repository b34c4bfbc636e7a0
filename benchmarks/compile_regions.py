"""Compile time of a train pass: the whole model torch.compile'd against each decoder layer (regional
compilation, flowrl.engines.train.regional_compile), on a Qwen2 of N layers with random weights.

Each mode runs in a process of its own with empty inductor caches: a forward and backward at one shape (the
first compile), then at another (rows and width change, as micro-batches do). Prints one JSON line per mode.
Measured on the 2-core CPU machine (2026-12-04, an 8-layer Qwen2 of hidden size 128, forward and backward):
the whole model 54.8 s, then 88.1 s at the second shape (torch.compile's default compiles it again, dynamic);
each layer (dynamic from the first compile) 30.4 s, then 0.1 s: 1 graph for all 8 layers and both shapes.

    python benchmarks/compile_regions.py [--layers 8] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def child(mode: str, layers: int, device: str) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=128, intermediate_size=384, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)
    model = Qwen2ForCausalLM(config).to(device)
    if mode == "whole":
        run = torch.compile(model.model)
    else:
        for layer in model.model.layers:
            layer.compile(dynamic=True)
        run = model.model
    seconds = []
    for rows, width in ((4, 48), (6, 40)):
        ids = torch.randint(0, 512, (rows, width), device=device)
        start = time.perf_counter()
        run(input_ids=ids, use_cache=False).last_hidden_state.float().pow(2).mean().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(round(time.perf_counter() - start, 1))
    print(json.dumps({"mode": mode, "layers": layers, "device": device, "first_s": seconds[0],
                      "second_shape_s": seconds[1],
                      "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"]}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--child", choices=("whole", "layers"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.layers, args.device)
        return
    for mode in ("whole", "layers"):
        with tempfile.TemporaryDirectory() as caches:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": caches, "TRITON_CACHE_DIR": caches + "/triton"}
            subprocess.run([sys.executable, __file__, "--child", mode, "--layers", str(args.layers),
                            "--device", args.device], env=env, check=False)


if __name__ == "__main__":
    main()
