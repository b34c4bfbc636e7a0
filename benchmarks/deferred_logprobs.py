"""Deferred old logprobs: time of actor.logprobs + actor.update, computed vs deferred.

When only a single-step update reads the old logprobs, the planner lets the
update take them from its own forward pass; this prints both times and the
ratio. Usage: python benchmarks/deferred_logprobs.py [cpu|cuda]
"""

from __future__ import annotations

import sys
import tempfile

import torch

from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.rl import losses
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.models.folders import load_causal_lm
from flowrl.graph.trace import Deferred
from flowrl.roles import Actor, UpdateSettings

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import bench_model, make_batch, seconds_per_call  # noqa: E402


def seconds(actor: Actor, batch, on_policy: bool, repeats: int, device: str) -> float:
    def once() -> None:
        if on_policy:  # as the plan folds actor.logprobs into the update
            actor.update(batch.clone(), loss=losses.ppo_loss(), deferred=Deferred("logprobs"))
        else:
            actor.update(actor.logprobs(batch.clone()), loss=losses.ppo_loss())

    return seconds_per_call(once, device, repeats)


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    big = device == "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_model(tmp, device, 1024)
        model = load_causal_lm(path, torch.bfloat16 if big else torch.float32)
    rows, response_len = (64, 512) if big else (32, 16)
    settings = UpdateSettings(mini_batch_size=rows, micro_batch_size=16 if big else 32)
    actor = Actor(engine=HFTrainEngine(model, HFTrainConfig(lr=1e-6), kind="actor", device=device), settings=settings)
    batch = make_batch(rows, 64, response_len, vocab=14)
    repeats = 5 if big else 3
    deferred = seconds(actor, batch, True, repeats, device)
    computed = seconds(actor, batch, False, repeats, device)
    print(f"device={device} rows={rows} response_len={response_len} computed={computed:.3f}s "
          f"deferred={deferred:.3f}s computed/deferred={computed / deferred:.2f}x")


if __name__ == "__main__":
    main()
