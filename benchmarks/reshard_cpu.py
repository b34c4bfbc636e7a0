"""Today's gather path against the reshard, measured on CPU gloo ranks, for the Qwen2.5-0.5B and -1.5B shapes
(bf16, built from their configs: random weights, no download). Colocated pool of `--world` ranks (the hybrid
engine under torchrun): each rank holds FSDP2's Shard(0) rows of every entry, made directly (no full model
anywhere); then, per rollout layout TP x DP:

- gather (today, StreamedSync / FSDP2 `full_tensor`): an all-gather of each entry, so every rank holds each
  full tensor in turn and vLLM's loader keeps its slice;
- reshard (flowrl.engines.weights.reshard): each rank receives only the rows its tensor rank keeps.

Prints, per shape and layout, the seconds of one sync (the slowest rank; the best of `--repeats`) and the most
bytes any rank received and sent (the reshard's measured, `Moved`; the gather's from its ring all-gather).

    python benchmarks/reshard_cpu.py --world 2 --bucket-mb 64
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flowrl.engines.weights.reshard import Moved, reshard
from flowrl.engines.weights.reshard_plan import Layout, fsdp_rows, gather_bytes, plan

from reshard_bytes import SHAPES, entries

GB = 1e9


def local_shards(items, rank: int, world: int) -> dict[str, torch.Tensor]:
    """This rank's Shard(0) rows of each entry, random (seeded by the entry's index: the same on every run)."""
    out = {}
    for index, (name, shape, dtype) in enumerate(items):
        start, stop = fsdp_rows(shape[0] if shape else 1, world)[rank]
        generator = torch.Generator().manual_seed(index * 1000 + rank)
        rows = (stop - start,) + tuple(shape[1:]) if shape else (1,)
        out[name] = torch.randn(rows, generator=generator).to(dtype)
    return out


def gather_sync(items, shards, world: int) -> None:
    """Today's path: each entry all-gathered whole on every rank (FSDP2 pads the chunks to one size)."""
    for name, shape, dtype in items:
        rows = shape[0] if shape else 1
        chunk = -(-rows // world)
        mine = shards[name].reshape(-1, *shape[1:]) if shape else shards[name]
        padded = torch.zeros((chunk, *shape[1:]), dtype=dtype)
        padded[:mine.shape[0]] = mine
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        full = torch.cat(parts)[:rows]
        del full, parts


def timed(fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the sync ends when its slowest rank does
    return float(seconds)


def rank_main(rank: int, world: int, store: str, bucket_mb: int, repeats: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    lines = []
    for name, shape in SHAPES.items():
        items = entries(shape)
        shards = local_shards(items, rank, world)
        ranks = list(range(world))
        for tp in (t for t in (1, 2, 4) if world % t == 0 and shape["num_attention_heads"] % t == 0):
            layout = Layout(tp, world // tp, shape["num_attention_heads"], shape["num_key_value_heads"])
            plans = plan(items, layout, ranks, ranks)
            old = min(timed(lambda: gather_sync(items, shards, world)) for _ in range(repeats))
            moved = [Moved() for _ in range(repeats)]
            new = min(timed(lambda m=m: [None for _ in reshard(dist.group.WORLD, rank, plans, shards,
                                                               device=torch.device("cpu"),
                                                               bucket_bytes=bucket_mb << 20, timeout_s=600,
                                                               moved=m)]) for m in moved)
            counts = torch.tensor([moved[0].received, moved[0].sent, moved[0].peak_bucket], dtype=torch.float64)
            dist.all_reduce(counts, op=dist.ReduceOp.MAX)
            old_sent, old_received = gather_bytes(plans, world)
            lines.append(f"| {name} | {world} colocated | TP{tp} x DP{world // tp} | {old:.2f} | {float(new):.2f} | "
                         f"{old / new:.2f}x | {old_received / GB:.3f} | {counts[0] / GB:.3f} | {old_sent / GB:.3f} | "
                         f"{counts[1] / GB:.3f} | {counts[2] / GB:.3f} |")
        del shards
    if rank == 0:
        Path(out).write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "rows.md")
        mp.start_processes(rank_main, args=(args.world, os.path.join(folder, "store"), args.bucket_mb, args.repeats,
                                            out), nprocs=args.world, start_method="spawn")
        print(f"CPU: {cpu_name()}; {args.world} gloo ranks, 1 thread each; bucket {args.bucket_mb} MB; bf16")
        print("| shape | pool | rollout | gather s | reshard s | speed-up | gather: max GB received | reshard: max GB "
              "received | gather: max GB sent | reshard: max GB sent | reshard: peak buffers GB |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        print(Path(out).read_text(), end="")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    return "unknown"


if __name__ == "__main__":
    main()
