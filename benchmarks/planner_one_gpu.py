"""Issue 43's bars on one GPU: the planner's layout against a small hand grid, same card, same run.

For each Qwen2.5 shape (random bf16 weights, benchmarks/common.qwen_model, tied embeddings): asks
`flowrl plan grpo --cluster found --write` for the chosen layout, then runs `flowrl train` with it and with each
hand-grid variant for `--steps` steps, each in its own process; reads each run's metrics.jsonl (timing_s/step
after the first step) and its peak memory (torch.cuda.max_memory_allocated, logged by the engines as
memory/peak_gib/*, else the last nvidia-smi reading) and prints per shape: chosen s/step, best grid s/step,
their ratio (bar: <= 1.15), predicted against measured step time and peak, and whether a run ran out of memory.
Workload: 16 prompts x 8, 256-token prompts, 1024 new tokens, long-tailed (EOS not suppressed).

Usage (on the GPU machine): python benchmarks/planner_one_gpu.py [--shapes 0.5B,1.5B,3B,7B] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import qwen_model  # noqa: E402

SHAPES = {
    "0.5B": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936),
    "1.5B": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936),
    "3B": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
               intermediate_size=11008, vocab_size=151936),
    "7B": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, vocab_size=152064),
}
WORKLOAD = ["train.device=cuda", "model.dtype=bfloat16", "train.batch_size=16", "algo.group_size=8",
            "roles.rollout.max_new_tokens=1024", "data.max_prompt_length=256", "eval.every=0",
            "checkpoint.every=0", "checkpoint.export=false"]
GRID = {  # the hand grid: what a user would try
    "hf_static": [],
    "vllm graphs 0.5 sleep1": ["roles.rollout.engine=vllm", "roles.rollout.enforce_eager=false",
                               "roles.rollout.gpu_memory_utilization=0.5", "roles.rollout.free_cache_engine=1"],
    "hf_static ckpt+offload": ["model.gradient_checkpointing=true", "roles.actor.offload_optimizer=true"],
    "vllm ckpt+offload": ["roles.rollout.engine=vllm", "roles.rollout.enforce_eager=false",
                          "roles.rollout.free_cache_engine=1", "model.gradient_checkpointing=true",
                          "roles.actor.offload_optimizer=true"],
}


def train(folder: Path, out: Path, steps: int, extra: list[str], config: Path | None = None) -> dict:
    cmd = [sys.executable, "-m", "flowrl", "train", "grpo", "--no-progress", "--steps", str(steps),
           "--output-dir", str(out), *(["--config", str(config)] if config else []),
           *[f"--set={kv}" for kv in [*WORKLOAD, f"model.path={folder}", *extra]]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    oom = "out of memory" in done.stderr.lower()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()] \
        if (out / "metrics.jsonl").exists() else []
    times = [r["timing_s/step"] for r in rows[1:] if "timing_s/step" in r]
    peaks = [v for r in rows for k, v in r.items() if k.startswith("memory/peak_gib")]
    return {"ok": done.returncode == 0, "oom": oom, "s_step": sum(times) / len(times) if times else None,
            "peak_gib": max(peaks) if peaks else None, "error": done.stderr.strip().splitlines()[-1:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name(0)}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.shapes.split(","):
            folder = Path(qwen_model(f"{tmp}/{name}", "0123456789+=", SHAPES[name], 2048, torch.bfloat16))
            chosen_file = Path(tmp) / f"{name}.json"
            plan = subprocess.run([sys.executable, "-m", "flowrl", "plan", "grpo", "--cluster", "found", "--write",
                                   str(chosen_file), *[f"--set={kv}" for kv in [*WORKLOAD, f"model.path={folder}"]]],
                                  capture_output=True, text=True, timeout=600)
            print(f"== {name}\n{plan.stdout}{plan.stderr[-500:]}")
            predicted = re.search(r"predicted ([\d.]+) s/step, peak ([\d.]+) GiB", plan.stdout)
            chosen = train(folder, Path(tmp) / f"{name}-chosen", args.steps, [], chosen_file) \
                if chosen_file.exists() else {"ok": False, "s_step": None}
            grid = {label: train(folder, Path(tmp) / f"{name}-{i}", args.steps, extra)
                    for i, (label, extra) in enumerate(GRID.items())}
            best = min((r["s_step"] for r in grid.values() if r["ok"] and r["s_step"]), default=None)
            for label, r in [("chosen", chosen), *grid.items()]:
                print(f"{name} {label:28s} {r}")
            if chosen["s_step"] and best:
                print(f"{name}: chosen {chosen['s_step']:.2f} s/step, best of grid {best:.2f}: ratio "
                      f"{chosen['s_step'] / best:.2f}x (bar <= 1.15)")
            if predicted and chosen["s_step"]:
                print(f"{name}: predicted {predicted[1]} s/step, {predicted[2]} GiB; measured "
                      f"{chosen['s_step']:.2f} s/step, {chosen['peak_gib']} GiB")


if __name__ == "__main__":
    main()
