"""Hybrid engine vs split placement: step time ratio of GRPO on one device.

Colocated (actor and rollout in one pool of one rank) generates with the
training module itself; split gives the rollout its own copy and syncs the
full weights before every step's generation. Prints seconds per step for
each and their ratio. Usage: python benchmarks/hybrid_engine.py [cpu|cuda]
"""

from __future__ import annotations

import sys
import tempfile

from flowrl.config import load_run_config
from flowrl.runtime.trainer import train

SPLIT = '{"pools": [{"name": "train", "roles": ["actor", "ref"], "device": "%s"}, ' \
        '{"name": "gen", "roles": ["rollout"], "device": "%s"}]}'


def seconds_per_step(device: str, placement: str | None, size: list[str]) -> float:
    with tempfile.TemporaryDirectory() as out:
        overrides = [f"train.output_dir={out}", f"train.device={device}", "train.steps=6", "checkpoint.every=0",
                     "roles.rollout.max_new_tokens=16", "task.max_operand=9", *size]
        if placement:
            overrides.append(f"placement={placement}")
        history = train(load_run_config(None, overrides), progress=False)
    timed = history[2:]  # the first steps warm up kernels and allocators
    return sum(row["timing_s/step"] for row in timed) / len(timed)


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    size = ["model.tiny_hidden_size=1024", "model.tiny_num_layers=12"] if device == "cuda" else []
    if device == "cuda":
        size.append("model.dtype=bfloat16")
    colocated = seconds_per_step(device, None, size)
    split = seconds_per_step(device, SPLIT % (device, device), size)
    print(f"device={device} colocated={colocated:.3f}s/step split={split:.3f}s/step "
          f"split/colocated={split / colocated:.2f}x")


if __name__ == "__main__":
    main()
