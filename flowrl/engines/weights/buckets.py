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
  separate from each pool's own group. Rank 0 broadcasts each bucket as a
  header (names, shapes, dtypes: JSON, no pickle) and one flat byte buffer,
  double-buffered: one bucket is in flight while the next is gathered, and
  the rollout ranks post the next header's receive before loading the
  current bucket. A peer that does not answer within the group's timeout is
  a `WeightSyncTimeout` naming the transfer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable, Iterator, Protocol

import torch
import torch.distributed as dist

Named = tuple[str, torch.Tensor]
SYNC_TIMEOUT_S = 600.0  # sync.timeout_s's default (flowrl.engines.weights.transport_configs), where engines build syncs
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
    """One tensor's place in a bucket's flat byte buffer."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "float32"
    offset: int

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * _dtype(self.dtype).itemsize


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def backend_for(device: torch.device) -> str:
    """The torch.distributed backend of a weight-sync group whose tensors live on `device`."""
    return "nccl" if device.type == "cuda" else "gloo"


class SyncGroup:
    """A process group of train rank 0 (rank 0 here) and the rollout ranks, apart from the pools' own groups."""

    def __init__(self, store: dist.Store, rank: int, size: int, device: str, host: str, timeout_s: float):
        self.rank, self.size, self.device, self.timeout_s = rank, size, torch.device(device), timeout_s
        timeout = timedelta(seconds=timeout_s)
        prefixed = dist.PrefixStore("flowrl-weight-sync", store)
        try:
            if backend_for(self.device) == "nccl":
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
                                    f"s: {first_line(err)}") from None

    @staticmethod
    def store(host: str, port: int, size: int, master: bool, timeout_s: float) -> dist.TCPStore:
        """The rendezvous store: the master (train rank 0) listens on `port` (0: a free one, `.port` says which)."""
        try:
            return dist.TCPStore(host, port, size, is_master=master, timeout=timedelta(seconds=timeout_s),
                                 wait_for_workers=False)
        except (RuntimeError, dist.DistError) as err:
            raise WeightSyncTimeout(f"weight sync rendezvous at {host}:{port} did not answer within {timeout_s:g} "
                                    f"s: {first_line(err)}") from None

    def set_timeout(self, timeout_s: float) -> None:
        """The deadline of the transfers from now on (the group formed under the one it was made with)."""
        self.group._set_default_timeout(timedelta(seconds=timeout_s))
        self.timeout_s = timeout_s

    def broadcast(self, tensor: torch.Tensor) -> "dist.Work":
        return self.group.broadcast(tensor, 0)

    def wait(self, work: "dist.Work", what: str) -> None:
        try:
            work.wait()
        except (RuntimeError, dist.DistError) as err:
            raise WeightSyncTimeout(f"weight sync: {what} got no answer within {self.timeout_s:g} s "
                                    f"(executor.node_timeout_s): {first_line(err)}") from None

    def close(self) -> None:
        self.group.shutdown()


class CollectiveTransport:
    """Broadcasts buckets from train rank 0 to the rollout ranks of one SyncGroup.

    Per bucket: its header (JSON: each entry's name, shape, dtype and offset; its length first), then its flat
    byte buffer; a header of length 0 ends the sync. Rank 0 fills the next bucket's buffer, one gathered
    tensor at a time, while the previous bucket is in flight; a rollout rank posts the next header's receive
    before it loads the bucket that landed.
    """

    sends_shards = False  # train rank 0 sends whole tensors, gathered on every train rank

    def __init__(self, group: SyncGroup, bucket_bytes: int):
        self.group, self.bucket_bytes = group, bucket_bytes

    def close(self) -> None:
        self.group.close()

    def send(self, named_tensors: Iterable[Named]) -> dict[str, float]:
        """Rank 0's side; the number of buckets and bytes sent."""
        in_flight: list[dist.Work] = []
        entries: list[Entry] = []
        buffer, offset, sent = None, 0, [0, 0]

        def flush() -> None:
            self._send_header(entries)
            if in_flight:  # the previous bucket: at most one in flight while this one was filled
                self.group.wait(in_flight.pop(), f"bucket {sent[0] - 1} to the rollout ranks")
            in_flight.append(self.group.broadcast(buffer[:offset]))
            sent[0], sent[1] = sent[0] + 1, sent[1] + offset

        for name, tensor in named_tensors:
            nbytes = tensor.numel() * tensor.element_size()
            if entries and _aligned(offset) + nbytes > self.bucket_bytes:
                flush()
                entries, buffer, offset = [], None, 0
            if buffer is None:  # a new one: the one in flight is still being read
                buffer = torch.empty(max(self.bucket_bytes, nbytes), dtype=torch.uint8, device=self.group.device)
            offset = _aligned(offset)
            buffer[offset:offset + nbytes].copy_(_as_bytes(tensor))
            entries.append(Entry(name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."), offset))
            offset += nbytes
        if entries:
            flush()
        self._send_header([])
        for work in in_flight:
            self.group.wait(work, "the last bucket to the rollout ranks")
        return {"buckets": float(sent[0]), "bytes": float(sent[1])}

    def receive(self) -> Iterator[Named]:
        """A rollout rank's side: (name, tensor) pairs, each bucket's as it lands."""
        index, header = 0, self._post_header_length()
        while True:
            entries = self._receive_header(*header)
            if not entries:
                return
            end = entries[-1].offset + entries[-1].nbytes
            buffer = torch.empty(end, dtype=torch.uint8, device=self.group.device)
            self.group.wait(self.group.broadcast(buffer), f"bucket {index} from train rank 0")
            header = self._post_header_length()  # the next bucket travels while this one loads
            for entry in entries:
                yield entry.name, buffer[entry.offset:entry.offset + entry.nbytes].view(_dtype(entry.dtype)).view(
                    entry.shape)
            index += 1

    def receive_into(self, engine: Any) -> dict[str, float]:
        """A rollout rank: `engine` loads each bucket as it lands; nothing to log (train rank 0 logs the sync)."""
        engine.load_weight_stream(self.receive())
        return {}

    def _send_header(self, entries: list[Entry]) -> None:
        data = json.dumps([e.__dict__ for e in entries]).encode() if entries else b""
        length = torch.tensor([len(data)], dtype=torch.int64, device=self.group.device)
        self.group.wait(self.group.broadcast(length), "a bucket header to the rollout ranks")
        if data:
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.group.device)
            self.group.wait(self.group.broadcast(payload), "a bucket header to the rollout ranks")

    def _post_header_length(self) -> tuple["dist.Work", torch.Tensor]:
        length = torch.zeros(1, dtype=torch.int64, device=self.group.device)
        return self.group.broadcast(length), length

    def _receive_header(self, work: "dist.Work", length: torch.Tensor) -> list[Entry]:
        self.group.wait(work, "a bucket header from train rank 0")
        if not int(length.item()):
            return []
        payload = torch.empty(int(length.item()), dtype=torch.uint8, device=self.group.device)
        self.group.wait(self.group.broadcast(payload), "a bucket header from train rank 0")
        raw = json.loads(payload.cpu().numpy().tobytes().decode())
        return [Entry(e["name"], tuple(e["shape"]), e["dtype"], e["offset"]) for e in raw]


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"weight sync: unknown dtype {name!r} in a bucket header")
    return dtype


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__
