"""The resharding executor: moves a plan (flowrl.engines.weights.reshard_plan) over torch.distributed, bucket by bucket.

Every rank of the sync group calls `reshard` with the same plan: a train rank passes its FSDP2 local shards
(`local_shards`: each DTensor's `to_local()`, rows `fsdp_rows` of the whole), a rollout rank gets back, one
parameter at a time, the block it keeps (`Kept`). Per bucket, each rank packs what it sends to each peer into
one byte buffer per peer, posts one receive per peer it gets anything from, waits for all of them under the
deadline, and cuts its kept blocks out of what arrived (a piece from itself is copied in place). No rank
holds more than one bucket's buffers and its own kept blocks; no full tensor is built anywhere.

Backends (one code path; `Exchange.on(device)` is the only switch, and the buffers live where the collective
runs: docs/cluster.md, "The reshard on NCCL", reviews each difference):
- gloo (CPU): each send and receive is its own `Work`, awaited with `Work.wait(timeout)`; a peer that stops
  is a WeightSyncTimeout naming the bucket and the peer within `timeout_s`.
- NCCL (CUDA): a rank's sends and receives of one bucket are one coalesced group (`_start_coalescing` /
  `_end_coalescing`, what `dist.batch_isend_irecv` does): NCCL's point-to-point calls block until matched,
  so ungrouped, two ranks that both send first would wait on each other. The group runs on the process
  group's own stream, which first waits for the current stream (where the send buffers were packed);
  `Work.wait(timeout)` makes the current stream wait for it and, given a timeout, blocks the host until it
  completes or the timeout passes (the work is then aborted and raises), so the deadline is the same
  WeightSyncTimeout; the group's own timeout (SyncGroup's from sync.timeout_s) bounds it as well. The
  buffers are device memory: O(bucket) on the GPU, and an offloaded (CPU) shard is copied to the device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterator, Mapping

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from flowrl.engines.weights.reshard_plan import Box, ParamPlan, Piece, bucketed
from flowrl.engines.weights.buckets import WeightSyncTimeout, first_line
from flowrl.engines.weights.kept_block import KeptBlock


@dataclass
class Kept:
    """What a rollout rank keeps of one entry: `tensor`, the block `box` of a tensor of `shape`."""

    name: str
    tensor: torch.Tensor
    box: Box
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Exchange:
    """How one bucket's transfers run on a device: the backend, whether a rank's sends and receives are one
    coalesced group (NCCL: ungrouped point-to-point calls block until matched), and where buffers live."""

    backend: str
    coalesced: bool
    device: torch.device

    @staticmethod
    def on(device: torch.device | str) -> "Exchange":
        device = torch.device(device)
        nccl = device.type == "cuda"
        return Exchange("nccl" if nccl else "gloo", nccl, device)


@dataclass
class Moved:
    """Bytes this rank sent to and received from other ranks in one sync, and its buckets."""

    sent: int = 0
    received: int = 0
    buckets: int = 0
    peak_bucket: int = 0  # the most bytes of send and receive buffers held at once
    timings: dict[str, float] = field(default_factory=dict)


def local_shards(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each state-dict entry's local FSDP2 shard (its `Shard(0)` rows), or the entry itself if not sharded."""
    out = {}
    for name, value in model.state_dict().items():
        if isinstance(value, DTensor):
            assert all(p.is_shard(0) for p in value.placements), f"{name}: FSDP2 places {value.placements}"
            value = value.to_local()
        out[name] = value.detach()
    return out


def reshard(group: Any, rank: int, plans: list[ParamPlan], shards: Mapping[str, torch.Tensor], *, device:
            torch.device, bucket_bytes: int, timeout_s: float, moved: Moved | None = None) -> Iterator[Kept]:
    """Runs `plans` over `group` (a torch ProcessGroup; `rank` this process's rank in it) bucket by bucket;
    yields this rank's Kept blocks (none on a train rank that keeps nothing). Counts the bytes in `moved`."""
    moved = moved if moved is not None else Moved()
    for index, bucket in enumerate(bucketed(plans, bucket_bytes)):
        yield from _bucket(group, rank, index, bucket, shards, device, timeout_s, moved)
        moved.buckets += 1


def _bucket(group: Any, rank: int, index: int, bucket: list[ParamPlan], shards: Mapping[str, torch.Tensor],
            device: torch.device, timeout_s: float, moved: Moved) -> Iterator[Kept]:
    outgoing: dict[int, list[tuple[ParamPlan, Piece]]] = {}
    incoming: dict[int, list[tuple[ParamPlan, Piece]]] = {}
    for one in bucket:
        for piece in one.pieces:
            if piece.src == rank:
                outgoing.setdefault(piece.dst, []).append((one, piece))
            elif piece.dst == rank:
                incoming.setdefault(piece.src, []).append((one, piece))
    send = pack_sends(rank, outgoing, shards, device)
    receive = receive_buffers(incoming, device)
    exchange_bucket(group, index, send, receive, Exchange.on(device), timeout_s)
    moved.sent += sum(b.numel() for b in send.values())
    moved.received += sum(b.numel() for b in receive.values())
    moved.peak_bucket = max(moved.peak_bucket, sum(b.numel() for b in [*send.values(), *receive.values()]))
    yield from _assemble(rank, bucket, shards, outgoing.get(rank, []), incoming, receive, device)


def pack_sends(rank: int, outgoing: dict[int, list[tuple[ParamPlan, Piece]]], shards: Mapping[str, torch.Tensor],
               device: torch.device) -> dict[int, torch.Tensor]:
    """One flat byte buffer per peer on the collective's `device` (an offloaded CPU shard is copied there:
    NCCL takes device tensors only); a piece to itself is not packed."""
    return {dst: torch.cat([_cut(shards[one.name], one, piece).view(-1).view(torch.uint8).to(device)
                            for one, piece in items]) for dst, items in outgoing.items() if dst != rank}


def receive_buffers(incoming: dict[int, list[tuple[ParamPlan, Piece]]], device: torch.device) -> dict[int,
                                                                                                   torch.Tensor]:
    """One byte buffer per peer this rank receives from, on `device`, sized by the plan's pieces."""
    return {src: torch.empty(sum(one.numel(p) * one.itemsize for one, p in items), dtype=torch.uint8,
                             device=device) for src, items in incoming.items()}


def _cut(shard: torch.Tensor, one: ParamPlan, piece: Piece) -> torch.Tensor:
    """The piece's rows (and columns) of a train rank's local shard (rows from `piece.shard0`), contiguous."""
    rows = shard.reshape(-1, *one.shape[1:])[piece.row0 - piece.shard0:piece.row1 - piece.shard0]
    return (rows[:, piece.col0:piece.col1] if piece.col1 > piece.col0 else rows).contiguous()


def exchange_bucket(group: Any, index: int, send: dict[int, torch.Tensor], receive: dict[int, torch.Tensor],
              how: Exchange, timeout_s: float) -> None:
    """Posts every send and receive of one bucket, then waits for each under one deadline."""
    if how.coalesced:  # NCCL: one group, else two ranks that both send first wait on each other
        group._start_coalescing(how.device)
    works = [(f"bucket {index}: the send to rank {dst}", group.send([buffer], dst, index))
             for dst, buffer in sorted(send.items())]
    works += [(f"bucket {index}: the receive from rank {src}", group.recv([buffer], src, index))
              for src, buffer in sorted(receive.items())]
    if how.coalesced:
        ended = group._end_coalescing(how.device)
        works = [(f"bucket {index}: the exchange with ranks {sorted({*send, *receive})}", ended)] if works else []
    deadline = time.monotonic() + timeout_s
    for what, work in works:
        try:
            work.wait(timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        except (RuntimeError, dist.DistError) as err:
            raise WeightSyncTimeout(f"weight sync: {what} got no answer within {timeout_s:g} s "
                                    f"(sync.timeout_s): {first_line(err)}") from None


def _assemble(rank: int, bucket: list[ParamPlan], shards: Mapping[str, torch.Tensor],
              own: list[tuple[ParamPlan, Piece]], incoming: dict[int, list[tuple[ParamPlan, Piece]]],
              receive: dict[int, torch.Tensor], device: torch.device) -> Iterator[Kept]:
    """Each entry of the bucket this rank keeps, from its own shard and from the buffers that arrived."""
    parts: dict[str, list[tuple[Piece, torch.Tensor]]] = {}
    for one, piece in own:
        parts.setdefault(one.name, []).append((piece, _cut(shards[one.name], one, piece)))
    for src, items in incoming.items():
        offset = 0
        for one, piece in items:
            size = one.numel(piece) * one.itemsize
            parts.setdefault(one.name, []).append((piece, receive[src][offset:offset + size]))
            offset += size
    for one in bucket:
        if rank not in one.keepers:
            continue
        box = one.box(rank)
        shape = list(one.shape) or [1]
        shape[box.dim] = box.stop - box.start
        kept = torch.empty(shape, dtype=one.dtype, device=device)
        base = box.start if box.dim == 0 else 0
        for piece, data in parts.get(one.name, []):
            block = kept[piece.row0 - base:piece.row1 - base]
            if data.dtype == torch.uint8:  # bytes of a buffer: a dtype view needs an offset it divides
                data = (data if data.storage_offset() % one.itemsize == 0 else data.clone()).view(one.dtype)
            block.copy_(data.view(block.shape))
        yield Kept(one.name, kept if one.shape else kept.view(()), box, one.shape)


def loader_view(kept: Kept) -> torch.Tensor:
    """What vLLM's loaders take of an entry: the tensor itself where this rank keeps it whole, else a KeptBlock
    (flowrl.engines.weights.kept_block): the entry's whole shape, only the kept block's data, which their
    `narrow` returns (vllm_params in tests/vllm_tp_reference.py), so no full tensor is allocated."""
    if not kept.shape or kept.box.stop - kept.box.start == kept.shape[kept.box.dim]:
        return kept.tensor  # kept whole
    return KeptBlock(kept.name, kept.tensor, kept.shape, kept.box)
