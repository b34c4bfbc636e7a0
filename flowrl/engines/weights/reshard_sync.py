"""The resharding weight sync: each rank moves only the shard it keeps (flowrl.engines.weights.reshard_plan's
plan, run by flowrl.engines.weights.reshard), where the other paths (flowrl.engines.weights.in_process.StreamedSync,
flowrl.engines.weights.buckets.CollectiveTransport) all-gather every full tensor on every train rank.

- `WeightShards`: what a sharded train engine offers (HFTrainEngine.weight_shards): each state-dict entry's
  name, whole shape and dtype, its local FSDP2 `Shard(0)` rows, the model's head counts and the device the
  collectives run on. An engine that must gather (a LoRA actor, whose merged weights exist only whole; an
  unsharded one) offers None, and the sync falls back to the gather path.
- `ReshardSync` (one process group, the hybrid engine): the train ranks and the rollout ranks are the same
  ranks (torchrun, or a Ray pool's own group); the rollout layout is `tp` ranks per engine times world / tp
  replicas (a Hugging Face rollout: tp 1, each rank a replica keeping every entry whole). Each rank feeds its
  kept blocks (`loader_view`) to its rollout engine's `load_weight_stream` as they land.
- `ReshardTransport` (split pools, a SyncGroup of every train rank, ranks 0..T-1, and every rollout rank,
  T..T+R-1): a train rank sends its pieces (`send`), a rollout rank loads what it keeps (`receive`).

Both log, per rank and sync, `sync/sent_mb` and `sync/received_mb` (what this rank moved to and from other
ranks; a piece to itself is copied in place), `sync/buffer_peak_mb` (the most bucket buffers held at once),
`sync/buckets` and `timing_s/sync`; a split pool's train ranks log what they sent, its rollout ranks what
they received.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch
import torch.distributed as dist

from flowrl import metrics
from flowrl.engines.weights.reshard import Moved, loader_view, reshard
from flowrl.engines.weights.reshard_plan import Layout, ParamPlan, check_layout, plan
from flowrl.engines.weights.buckets import SYNC_TIMEOUT_S, Named, SyncGroup

MB = 1 << 20
Entry = tuple[str, tuple[int, ...], torch.dtype]


@dataclass
class WeightShards:
    """A sharded train engine's weights as the reshard reads them."""

    entries: list[Entry]  # (name, whole shape, dtype) of each state-dict entry, in order
    local: Mapping[str, torch.Tensor]  # each entry's local rows (FSDP2 Shard(0): torch.chunk's split)
    num_heads: int
    num_kv_heads: int
    device: torch.device  # where the collectives run (the engine's device; offloaded shards are CPU tensors)


def model_heads(config: Any) -> tuple[int, int]:
    """(attention heads, key-value heads) of a transformers config (no key-value count: multi-head)."""
    heads = config.num_attention_heads
    return heads, getattr(config, "num_key_value_heads", None) or heads


def moved_metrics(moved: Moved, seconds: float, sent: bool = True, received: bool = True) -> dict[str, float]:
    """One sync's counts as metrics (module docstring)."""
    out = {"sync/buffer_peak_mb": moved.peak_bucket / MB, "sync/buckets": float(moved.buckets),
           "timing_s/sync": seconds}
    out.update({"sync/sent_mb": moved.sent / MB} if sent else {})
    out.update({"sync/received_mb": moved.received / MB} if received else {})
    return out


class ReshardSync:
    """The hybrid engine's weight sync over the default process group: rollout layout `tp` x world / tp."""

    def __init__(self, fallback: Callable[[Any, Any], None], tp: int = 1, bucket_bytes: int = 256 * MB,
                 timeout_s: float = SYNC_TIMEOUT_S):
        self.fallback, self.tp, self.bucket_bytes, self.timeout_s = fallback, tp, bucket_bytes, timeout_s
        self.plans: list[ParamPlan] | None = None  # made on the first sync (the shapes never change)
        self.last: Moved | None = None  # the last sync's counts (tests and benchmarks read them)

    def __call__(self, train: Any, rollout: Any) -> None:
        shards = train.weight_shards()
        if shards is None:  # a LoRA actor's merged weights, an unsharded engine: `fallback`, the gather path
            return self.fallback(train, rollout)
        world, rank = dist.get_world_size(), dist.get_rank()
        if self.plans is None:
            layout = Layout(self.tp, check_layout(world, self.tp), shards.num_heads, shards.num_kv_heads)
            self.plans = plan(shards.entries, layout, list(range(world)), list(range(world)))
        start, moved = time.perf_counter(), Moved()
        kept = reshard(dist.group.WORLD, rank, self.plans, shards.local, device=shards.device,
                       bucket_bytes=self.bucket_bytes, timeout_s=self.timeout_s, moved=moved)
        count = rollout.load_weight_stream((k.name, loader_view(k)) for k in kept)
        for name, value in moved_metrics(moved, time.perf_counter() - start).items():
            metrics.log(name, value)
        metrics.log("rollout/sync_buckets", count)
        self.last = moved


@dataclass(frozen=True)
class ReshardShape:
    """What every rank of a split pools' sync group plans from (the driver asks the pools once)."""

    entries: list[Entry]
    num_heads: int
    num_kv_heads: int
    num_train: int  # sync-group ranks 0..num_train-1 hold the FSDP2 shards, the rest are the rollout ranks
    tp: int  # the rollout engine's tensor-parallel ranks


class ReshardTransport:
    """Split pools: train ranks 0..num_train-1 and rollout ranks num_train.. of one SyncGroup; rollout layout
    `tp` x (rollout ranks / tp)."""

    sends_shards = True  # every train rank sends the rows its FSDP2 shard holds (WeightShards)

    def __init__(self, group: SyncGroup, shape: ReshardShape, bucket_bytes: int):
        num_train = shape.num_train
        layout = Layout(shape.tp, check_layout(group.size - num_train, shape.tp), shape.num_heads, shape.num_kv_heads)
        self.group, self.bucket_bytes = group, bucket_bytes
        self.plans = plan(shape.entries, layout, list(range(num_train)), list(range(num_train, group.size)))

    def close(self) -> None:
        self.group.close()

    def send(self, shards: WeightShards) -> dict[str, float]:
        """A train rank's side: its pieces to the rollout ranks that keep them; its metrics."""
        start, moved = time.perf_counter(), Moved()
        for _ in self._run(shards.local, moved):  # a train rank keeps nothing
            pass
        return moved_metrics(moved, time.perf_counter() - start, received=False)

    def receive(self, moved: Moved | None = None) -> Iterator[Named]:
        """A rollout rank's side: (name, the entry as vLLM's loaders take it: `loader_view`), as they land."""
        for kept in self._run({}, moved if moved is not None else Moved()):
            yield kept.name, loader_view(kept)

    def receive_into(self, engine: Any) -> dict[str, float]:
        """A rollout rank: `engine` loads each block as it lands; what this rank received, and its seconds."""
        start, moved = time.perf_counter(), Moved()
        engine.load_weight_stream(self.receive(moved))
        return moved_metrics(moved, time.perf_counter() - start, sent=False)

    def _run(self, local: Mapping[str, torch.Tensor], moved: Moved) -> Iterator[Any]:
        return reshard(self.group.group, self.group.rank, self.plans, local, device=self.group.device,
                       bucket_bytes=self.bucket_bytes, timeout_s=self.group.timeout_s, moved=moved)
