"""Length-grouped micro-batches: actor forward + update on variable-length responses, grouped vs in order.

With `by_length` the train engine sorts rows by length before cutting micro-batches and trims each
micro-batch's all-padding columns; without it every micro-batch runs at the batch's full width.
Prints both times and the ratio. Usage: python benchmarks/length_grouping.py [cpu|cuda]
"""

from __future__ import annotations

import sys
import tempfile

import torch

from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.rl import losses
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.models.folders import load_causal_lm
from flowrl.roles import Actor, UpdateSettings

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import bench_model, make_batch, seconds_per_call  # noqa: E402


def variable_lengths(batch, longest: int):
    """Responses from 1/16 of the width to all of it, in random order (as sampled responses come)."""
    rows = batch.batch_size[0]
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(longest // 16, longest + 1, (rows,), generator=gen)
    batch["response_mask"] = (torch.arange(longest)[None] < lengths[:, None]).long()
    return batch


def seconds(path, by_length: bool, batch, device: str, big: bool) -> float:
    model = load_causal_lm(path, torch.bfloat16 if big else torch.float32)
    engine = HFTrainEngine(model, HFTrainConfig(lr=1e-6), kind="actor", device=device, by_length=by_length)
    actor = Actor(engine=engine, settings=UpdateSettings(mini_batch_size=batch.batch_size[0], micro_batch_size=8))
    run = lambda: actor.update(actor.logprobs(batch.clone()), loss=losses.ppo_loss())  # noqa: E731
    return seconds_per_call(run, device, warmup=1)


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    big = device == "cuda"
    longest = 2048 if big else 64
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_model(tmp, device, longest + 128)
        batch = variable_lengths(make_batch(64 if big else 32, 64, longest, vocab=14), longest)
        in_order, grouped = (seconds(path, flag, batch, device, big) for flag in (False, True))
    print(f"device={device} rows={batch.batch_size[0]} longest={longest} in_order={in_order:.3f}s "
          f"grouped={grouped:.3f}s in_order/grouped={in_order / grouped:.2f}x")


if __name__ == "__main__":
    main()
