"""How a weight update reaches `vllm_server` replicas (flowrl.engines.vllm.server): a file, or vLLM's NCCL transfer.

`roles.rollout.weight_transfer` picks the path (`transfer_for`): `file` everywhere, `nccl` on CUDA only, `auto`
(the default) NCCL on CUDA and the file on CPU. The file path is VLLMServerEngine.load_weight_stream: the
tensors written as one safetensors file, `/collective_rpc reload_weights`, `/reset_prefix_cache`. It is also
what a CUDA run uses where the trainer shares the rollout's process (the local executor's hybrid engine), since
the NCCL group needs the trainer on a GPU of its own.

The NCCL path is vLLM's own weight transfer (vLLM 0.26: `vllm/entrypoints/serve/dev/rlhf/api_router.py`, the
worker's `init_weight_transfer_engine` / `start_weight_update` / `update_weights` / `finish_weight_update`,
`vllm/distributed/weight_transfer/nccl_engine.py`), as verl's and slime's servers use it:

- each server starts with `--weight-transfer-config {"backend": "nccl"}` (`server_args`);
- one NCCL group holds the trainer (train rank 0, group rank 0) and every server's workers: R replicas of k
  workers (tensor parallel) make a world of 1 + R k, replica r's workers at ranks 1 + r k .. r k + k
  (`NcclLayout`; vLLM adds the worker's own rank to the `rank_offset` it is given). The trainer joins with
  vLLM's `StatelessProcessGroup` and `PyNcclCommunicator` (`NcclTrainer`, what vLLM's `trainer_init` does)
  while each rollout rank posts `/init_weight_transfer_engine {"init_info": init_info(...)}` to its server;
- an update: each rollout rank posts `/start_weight_update`; per bucket of about `sync.bucket_mb`, train rank 0
  publishes the bucket's names, dtypes and shapes (JSON) in the sync group's store, each rollout rank posts
  `/update_weights {"update_info": update_info(...)}` and the trainer broadcasts the bucket's tensors one by one
  (vLLM's unpacked receive: an empty tensor per entry, a broadcast from rank 0, `load_weights`); then
  `/finish_weight_update` (vLLM's layerwise reload finalizes) and `/reset_prefix_cache`.

`ServerNcclTransport` is that protocol on both sides (the Ray executor builds it for split pools whose
follower is a server with NCCL transfer: flowrl.runtime.ray.worker).
"""

from __future__ import annotations

import itertools
import json
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterable, Literal, Protocol

import torch

from flowrl.engines.weights.buckets import Named, buckets

Transfer = Literal["auto", "nccl", "file"]
HEADER = "flowrl-vllm-nccl"  # store keys: HEADER/port, HEADER/<sync>/<bucket>


def transfer_for(choice: Transfer, device: str) -> Literal["nccl", "file"]:
    """The path a server on `device` takes: auto is NCCL on CUDA, the file on CPU; NCCL off CUDA is one line."""
    cuda = device.startswith("cuda")
    if choice == "nccl" and not cuda:
        raise ValueError(f"roles.rollout.weight_transfer=nccl needs CUDA (the rollout runs on {device}); use file "
                         f"or auto")
    if choice == "auto":
        return "nccl" if cuda else "file"
    return choice


def server_args(transfer: str) -> list[str]:
    """What `vllm serve` needs for the path: the NCCL weight-transfer engine, or nothing."""
    return ["--weight-transfer-config", json.dumps({"backend": "nccl"})] if transfer == "nccl" else []


@dataclass(frozen=True)
class NcclLayout:
    """The NCCL group of one trainer (rank 0) and `replicas` servers of `workers` each (tensor x pipeline)."""

    replicas: int
    workers: int

    @property
    def world_size(self) -> int:
        return 1 + self.replicas * self.workers

    def rank_offset(self, replica: int) -> int:
        """Replica `replica`'s first rank; vLLM adds each worker's rank within the server."""
        assert 0 <= replica < self.replicas, (replica, self.replicas)
        return 1 + replica * self.workers


def init_info(host: str, port: int, layout: NcclLayout, replica: int) -> dict[str, Any]:
    """`/init_weight_transfer_engine`'s `init_info` for server `replica` (vLLM's NCCLWeightTransferInitInfo)."""
    return {"master_address": host, "master_port": port, "rank_offset": layout.rank_offset(replica),
            "world_size": layout.world_size}


def update_info(entries: list[tuple[str, str, list[int]]]) -> dict[str, Any]:
    """`/update_weights`' `update_info` for one bucket of (name, dtype name, shape) (vLLM's
    NCCLWeightTransferUpdateInfo, unpacked: one broadcast per entry, in this order)."""
    return {"names": [name for name, _, _ in entries], "dtype_names": [dtype for _, dtype, _ in entries],
            "shapes": [list(shape) for _, _, shape in entries]}


def header(bucket: list[Named]) -> list[tuple[str, str, list[int]]]:
    return [(name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape)) for name, tensor in bucket]


class ServerWeights(Protocol):
    """What a rollout rank's server engine (VLLMServerEngine) does for the NCCL path: one HTTP call each."""

    def init_weight_transfer(self, info: dict[str, Any]) -> None: ...

    def start_weight_update(self) -> None: ...

    def update_weights(self, info: dict[str, Any]) -> None: ...

    def finish_weight_update(self) -> None: ...


class NcclTrainer:
    """Train rank 0 in vLLM's NCCL weight-transfer group, on its current GPU (what vLLM's trainer_init makes)."""

    def __init__(self, host: str, port: int, world_size: int, timeout_s: float):
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        group = StatelessProcessGroup.create(host=host, port=port, rank=0, world_size=world_size,
                                             store_timeout=int(timeout_s))
        self.comm = PyNcclCommunicator(group, device=torch.cuda.current_device())

    def send(self, bucket: list[Named]) -> None:
        """The bucket's tensors in order, one broadcast each; returns once the servers' workers received them."""
        stream = torch.cuda.current_stream()
        for _, tensor in bucket:
            self.comm.broadcast(tensor.detach().to(self.comm.device).contiguous(), src=0, stream=stream)
        stream.synchronize()


class ServerNcclTransport:
    """Both sides of the NCCL path over one weight-sync group's store (see the module docstring): `rank` 0 is
    train rank 0, rank r >= 1 drives server replica r - 1. `trainer` makes rank 0's side of the NCCL group
    (NcclTrainer; a test passes a fake)."""

    sends_shards = False  # train rank 0 sends whole tensors, gathered on every train rank

    def __init__(self, store: Any, rank: int, layout: NcclLayout, bucket_bytes: int, timeout_s: float,
                 trainer: Callable[[str, int, int, float], Any] = NcclTrainer):
        self.store, self.rank, self.layout = store, rank, layout
        self.bucket_bytes, self.timeout_s, self.make_trainer = bucket_bytes, timeout_s, trainer
        self.trainer: Any = None
        self.syncs = 0

    def open(self, host: str, server: ServerWeights | None = None) -> None:
        """Forms the NCCL group: rank 0 picks a port on `host` and joins as the trainer; a rollout rank reads it
        and has its `server`'s workers join (both block until every member did)."""
        if self.rank == 0:
            port = free_port(host)
            self.store.set(f"{HEADER}/port", json.dumps([host, port]))
            self.trainer = self.make_trainer(host, port, self.layout.world_size, self.timeout_s)
            return
        assert server is not None
        self.store.wait([f"{HEADER}/port"], timedelta(seconds=self.timeout_s))
        host, port = json.loads(self.store.get(f"{HEADER}/port"))
        server.init_weight_transfer(init_info(host, port, self.layout, self.rank - 1))

    def send(self, named_tensors: Iterable[Named]) -> dict[str, float]:
        """Rank 0: each bucket's header into the store, then its tensors over NCCL; the buckets and bytes."""
        assert self.rank == 0 and self.trainer is not None
        sync, self.syncs, count, sent = self.syncs, self.syncs + 1, 0, 0
        for count, bucket in enumerate(buckets(named_tensors, self.bucket_bytes), start=1):
            self.store.set(f"{HEADER}/{sync}/{count - 1}", json.dumps(header(bucket)))
            self.trainer.send(bucket)
            sent += sum(t.numel() * t.element_size() for _, t in bucket)
        self.store.set(f"{HEADER}/{sync}/{count}", "[]")  # the end
        return {"buckets": float(count), "bytes": float(sent)}

    def receive_into(self, server: ServerWeights) -> dict[str, float]:
        """A rollout rank: its server's workers receive every bucket (one /update_weights each); nothing to log
        (train rank 0 logs the sync)."""
        sync, self.syncs = self.syncs, self.syncs + 1
        server.start_weight_update()
        try:
            for index in itertools.count():
                key = f"{HEADER}/{sync}/{index}"
                self.store.wait([key], timedelta(seconds=self.timeout_s))
                entries = json.loads(self.store.get(key))
                if not entries:
                    return {}
                server.update_weights(update_info([(n, d, list(s)) for n, d, s in entries]))
        finally:
            server.finish_weight_update()
        raise AssertionError("itertools.count() ended")

    def close(self) -> None:
        self.trainer = None  # vLLM's communicator goes with its last reference, as vLLM's shutdown() does


def free_port(host: str) -> int:
    """A port free on `host` now (the server's own, or the NCCL group's rendezvous)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
