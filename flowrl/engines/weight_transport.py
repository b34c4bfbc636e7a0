"""Weight transports: how the actor's weights reach a rollout engine, as buckets of (name, tensor) pairs.

No transport builds a full state dict. The train engine yields its entries
one at a time, unsharded on its device (`named_full_tensors`: FSDP2's
`full_tensor`, an all-gather, so every train rank iterates them all), and
the rollout engine loads each bucket as it arrives (`load_weight_stream`:
vLLM's `reload_weights` over an iterator, `copy_` per entry for HF models).

- `InProcessTransport` (`sync.transport=in_process`): the rollout engine is in
  the train engine's process, the hybrid engine or each torchrun rank's own
  unsharded rollout copy; tensors pass by reference.
- `CollectiveTransport` (`sync.transport=collective`): the rollout is in
  other processes (split Ray pools, other nodes). Train rank 0 and every
  rollout rank form a torch.distributed group of their own (`SyncGroup`:
  gloo on CPU, NCCL on CUDA, rendezvous through a TCPStore at train rank 0),
  separate from each pool's own group. Rank 0 sends the layout once per sync
  (names, shapes, dtypes: JSON, no pickle), then broadcasts each bucket as
  one flat byte buffer, double-buffered: one bucket is in flight while the
  next is gathered; the rollout ranks post the next receive before loading
  the current bucket. A peer that does not answer within the group's
  timeout is a `WeightSyncTimeout` naming the transfer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterable, Iterator, Protocol

import torch
import torch.distributed as dist

Named = tuple[str, torch.Tensor]
ALIGN = 16  # byte offset of every tensor in a bucket's buffer: any dtype may view it


class WeightSyncTimeout(RuntimeError):
    """A weight transfer whose peer did not answer within the deadline."""


class WeightLoader(Protocol):
    """What a rollout engine offers a transport: load (name, tensor) pairs as they come."""

    def load_weight_stream(self, named_tensors: Iterable[Named]) -> int: ...


def buckets(named_tensors: Iterable[Named], bucket_bytes: int) -> Iterator[list[Named]]:
    """Consecutive pairs grouped into lists of at most `bucket_bytes` (a larger tensor goes alone)."""
    bucket: list[Named] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


@dataclass(frozen=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "float32"
    offset: int  # in its bucket's buffer

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * _dtype(self.dtype).itemsize


def layout(shapes: Iterable[tuple[str, tuple[int, ...], torch.dtype]], bucket_bytes: int) -> list[list[Entry]]:
    """Each state-dict entry's place: which bucket and at which aligned offset of its flat buffer."""
    out: list[list[Entry]] = []
    size = 0
    for name, shape, dtype in shapes:
        nbytes = _numel(shape) * dtype.itemsize
        if not out or (size and size + nbytes > bucket_bytes):  # a larger tensor goes alone
            out.append([])
            size = 0
        out[-1].append(Entry(name, tuple(shape), str(dtype).removeprefix("torch."), size))
        size += -(-nbytes // ALIGN) * ALIGN
    return out


def bucket_size(bucket: list[Entry]) -> int:
    return bucket[-1].offset + bucket[-1].nbytes if bucket else 0


class SyncGroup:
    """A process group of train rank 0 (rank 0 here) and the rollout ranks, apart from the pools' own groups."""

    def __init__(self, store: dist.Store, rank: int, size: int, device: str, host: str, timeout_s: float):
        self.rank, self.size, self.device, self.timeout_s = rank, size, torch.device(device), timeout_s
        timeout = timedelta(seconds=timeout_s)
        prefixed = dist.PrefixStore("flowrl-weight-sync", store)
        try:
            if self.device.type == "cuda":
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                self.group = dist.ProcessGroupNCCL(prefixed, rank, size, options)
            else:
                options = dist.ProcessGroupGloo._Options()
                options._timeout = timeout
                options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
                self.group = dist.ProcessGroupGloo(prefixed, rank, size, options)
        except (RuntimeError, dist.DistError) as err:
            raise WeightSyncTimeout(f"weight sync group (rank {rank} of {size}) did not form within {timeout_s:g} "
                                    f"s: {_first_line(err)}") from None

    @staticmethod
    def store(host: str, port: int, size: int, master: bool, timeout_s: float) -> dist.TCPStore:
        """The rendezvous store: the master (train rank 0) listens on `port` (0: a free one, `.port` says which)."""
        try:
            return dist.TCPStore(host, port, size, is_master=master, timeout=timedelta(seconds=timeout_s),
                                 wait_for_workers=False)
        except (RuntimeError, dist.DistError) as err:
            raise WeightSyncTimeout(f"weight sync rendezvous at {host}:{port} did not answer within {timeout_s:g} "
                                    f"s: {_first_line(err)}") from None

    def broadcast(self, tensor: torch.Tensor) -> "dist.Work":
        return self.group.broadcast(tensor, 0)

    def wait(self, work: "dist.Work", what: str) -> None:
        try:
            work.wait()
        except (RuntimeError, dist.DistError) as err:
            raise WeightSyncTimeout(f"weight sync: {what} got no answer within {self.timeout_s:g} s "
                                    f"(train.node_timeout_s): {_first_line(err)}") from None

    def close(self) -> None:
        self.group.shutdown()


class CollectiveTransport:
    """Broadcasts buckets from train rank 0 to the rollout ranks of one SyncGroup."""

    def __init__(self, group: SyncGroup, bucket_bytes: int):
        self.group, self.bucket_bytes = group, bucket_bytes

    def send(self, named_tensors: Iterable[Named], shapes: list[tuple[str, tuple[int, ...], torch.dtype]],
             ) -> dict[str, float]:
        """Rank 0's side: the layout, then each bucket as gathered; two buckets in flight at most."""
        plan = layout(shapes, self.bucket_bytes)
        self._send_layout(plan)
        stream = iter(named_tensors)
        pending: list[tuple[dist.Work, torch.Tensor]] = []
        for index, bucket in enumerate(plan):
            buffer = torch.empty(bucket_size(bucket), dtype=torch.uint8, device=self.group.device)
            for entry in bucket:
                name, tensor = next(stream)
                assert name == entry.name, (name, entry.name)
                buffer[entry.offset:entry.offset + entry.nbytes].copy_(_as_bytes(tensor))
            if len(pending) == 2:
                self.group.wait(pending.pop(0)[0], f"bucket {index - 2} to the rollout ranks")
            pending.append((self.group.broadcast(buffer), buffer))
        for work, _ in pending:
            self.group.wait(work, "the last buckets to the rollout ranks")
        return {"buckets": float(len(plan)), "bytes": float(sum(map(bucket_size, plan)))}

    def receive(self) -> Iterator[Named]:
        """A rollout rank's side: (name, tensor) pairs of each bucket as it lands; the next bucket's receive is
        posted before this one is handed on."""
        plan = self._receive_layout()

        def post(index: int) -> tuple[dist.Work, torch.Tensor]:
            buffer = torch.empty(bucket_size(plan[index]), dtype=torch.uint8, device=self.group.device)
            return self.group.broadcast(buffer), buffer

        landing = post(0) if plan else None
        for index, bucket in enumerate(plan):
            work, buffer = landing
            landing = post(index + 1) if index + 1 < len(plan) else None
            self.group.wait(work, f"bucket {index} from train rank 0")
            for entry in bucket:
                yield entry.name, _from_bytes(buffer, entry)

    def _send_layout(self, plan: list[list[Entry]]) -> None:
        data = json.dumps([[e.__dict__ for e in bucket] for bucket in plan]).encode()
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.group.device)
        self.group.wait(self.group.broadcast(size), "the layout to the rollout ranks")
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.group.device)
        self.group.wait(self.group.broadcast(payload), "the layout to the rollout ranks")

    def _receive_layout(self) -> list[list[Entry]]:
        size = torch.zeros(1, dtype=torch.int64, device=self.group.device)
        self.group.wait(self.group.broadcast(size), "the layout from train rank 0")
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=self.group.device)
        self.group.wait(self.group.broadcast(payload), "the layout from train rank 0")
        raw = json.loads(payload.cpu().numpy().tobytes().decode())
        return [[Entry(e["name"], tuple(e["shape"]), e["dtype"], e["offset"]) for e in bucket] for bucket in raw]


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"weight sync: unknown dtype {name!r} in the layout")
    return dtype


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _from_bytes(buffer: torch.Tensor, entry: Entry) -> torch.Tensor:
    return buffer[entry.offset:entry.offset + entry.nbytes].view(_dtype(entry.dtype)).view(entry.shape)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__
