"""Activation checkpointing: peak memory and time of one actor update, off vs on.

Prints both and their ratios. Usage: python benchmarks/activation_checkpointing.py cuda
(on CPU only the time is measured).
"""

from __future__ import annotations

import sys
import tempfile

import torch

from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.rl import losses
from flowrl.runtime.factory import _trainable
from flowrl.config import load_run_config
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.models.folders import load_causal_lm
from flowrl.roles import Actor, UpdateSettings

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import bench_model, make_batch, seconds_per_call  # noqa: E402


def measure(path: str, checkpointing: bool, device: str, batch) -> tuple[float, float]:
    cfg = load_run_config(None, [f"model.gradient_checkpointing={str(checkpointing).lower()}"])
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = _trainable(load_causal_lm(path, dtype), cfg)
    actor = Actor(engine=HFTrainEngine(model, HFTrainConfig(lr=1e-6), kind="actor", device=device),
                  settings=UpdateSettings(mini_batch_size=batch.batch_size[0], micro_batch_size=16))
    run = lambda: actor.update(actor.logprobs(batch.clone(), deferred=True), loss=losses.ppo_loss())  # noqa: E731
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    elapsed = seconds_per_call(run, device, warmup=1)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return elapsed, peak


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    big = device == "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_model(tmp, device, 2048)
        batch = make_batch(64 if big else 16, 64, 1024 if big else 16, vocab=14)
        (t_off, m_off), (t_on, m_on) = (measure(str(path), flag, device, batch) for flag in (False, True))
    print(f"device={device} off: {t_off:.3f}s {m_off:.2f}GiB  on: {t_on:.3f}s {m_on:.2f}GiB  "
          f"memory off/on={m_off / m_on:.2f}x time on/off={t_on / t_off:.2f}x")


if __name__ == "__main__":
    main()
