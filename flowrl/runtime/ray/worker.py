"""PoolWorker: one rank of a pool, as a Ray actor holding that pool's roles.

The driver (flowrl.runtime.ray.executor) creates one per rank, on the
rank's bundle of the pool's placement group. `setup` joins the pool's own
torch.distributed process group when the pool has several ranks (gloo on
CPU, NCCL on CUDA; at the address rank 0's `rendezvous` gave), so train
engines shard with FSDP2 across exactly that pool's workers, then builds only
the pool's roles with the pool's RoleFactory, loading shipped model folders
from this node's copy. `save`, `load` and `save_pretrained` with no path move
files to and from the driver instead of this node's disk (executor.ship_files).
Every other method is a thin call into a role or its engine; collectives
(FSDP forwards, updates, the weight sync's gathers, save) work because the
driver calls every rank of a pool.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time
from pathlib import Path
from typing import Any

import ray
import torch
import torch.distributed as dist
import transformers
from tensordict import TensorDict

from flowrl import metrics
from flowrl.engines.train import sharded_checkpoint
from flowrl.engines.weights.reshard_sync import ReshardShape
from flowrl.engines.weights.transport_configs import TransportConfig
from flowrl.engines.weights.buckets import CollectiveTransport, SyncGroup
from flowrl.engines.vllm.server import VLLMServerEngine
from flowrl.engines.vllm.server_weights import NcclLayout, ServerNcclTransport
from flowrl.graph.context import CallInfo
from flowrl.graph.role import close_role
from flowrl.graph.trace import Node
from flowrl.runtime.ray.cluster import Files, ShippedFolder, pack, scratch, unpack
from flowrl.runtime import threads
from flowrl.runtime.observe import gc_heap
from flowrl.runtime.scheduling import call_role
from flowrl.runtime.offpolicy.stream_runner import StreamRunner


class PoolWorker:
    def __init__(self) -> None:
        self.sync_stores: dict[str, Any] = {}  # weight-sync rendezvous this rank (train rank 0) hosts, by key
        self.transports: dict[str, tuple[Any, Any]] = {}  # by key: the transport (CollectiveTransport, ...), its store
        self.streams: dict[str, StreamRunner] = {}  # a streamed rollout's runner, by role (made on first use)

    def rendezvous(self) -> str:
        """Where the pool's process group meets (asked of rank 0): this node's address and a port free here."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def setup(self, factory: Any, names: tuple[str, ...], device: str, rank: int, world_size: int,
              address: str, shipped: dict[str, ShippedFolder] | None = None, cpu_threads: int = 0) -> None:
        """Join the pool's process group (world_size > 1) and build the roles in `names` (from this node's
        copies of the `shipped` folders, if given) with torch on `cpu_threads` threads (executor.cpu_threads; 0:
        the OMP_NUM_THREADS Ray sets, 1 for a worker that asks for no whole CPU)."""
        threads.set_cpu_threads(cpu_threads)
        if shipped is not None:
            factory = factory.relocated({path: folder.local() for path, folder in shipped.items()})
        if world_size > 1:
            host, port = address.removeprefix("tcp://").rsplit(":", 1)  # what vLLM's external launcher reads
            os.environ.update(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world_size), MASTER_ADDR=host,
                              MASTER_PORT=port)
            if device == "cuda":
                torch.cuda.set_device(0)  # Ray makes this worker's one GPU the only visible device
            dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=address, rank=rank,
                                    world_size=world_size)
        transformers.utils.logging.disable_progress_bar()
        random.seed(factory.seed)
        torch.manual_seed(factory.seed)
        self.roles = factory.build(names)

    @ray.method(num_returns=2)
    def call(self, node: Node, batch: TensorDict, info: CallInfo,
             keep: tuple[str, ...] | None) -> tuple[TensorDict, dict[str, float]]:
        """The node's role method on this rank's rows and the metrics it logged; only `keep` fields (None: all)
        return."""
        with metrics.collect() as logged:
            out = call_role(node, self.roles[node.role], batch, info)
        return (out if keep is None else out.select(*keep)), logged

    def weight_layout(self, role: str) -> tuple[Any, int, int] | None:
        """Train rank 0: (entries, attention heads, key-value heads) of the role's shards, for a reshard plan;
        None where the sync must gather (LoRA, unsharded)."""
        shards = self.roles[role].engine.weight_shards()
        return None if shards is None else (shards.entries, shards.num_heads, shards.num_kv_heads)

    def tensor_ranks(self, role: str) -> int:
        """The ranks one of the role's rollout engines spans (tensor parallel)."""
        return self.roles[role].engine.tp_ranks

    def server_workers(self, role: str) -> int:
        """The workers of the role's server in vLLM's NCCL weight transfer (flowrl.engines.vllm.server_weights);
        0 for any other engine, or a server on the file path."""
        engine = self.roles[role].engine
        return engine.nccl_workers if isinstance(engine, VLLMServerEngine) else 0

    def open_weight_sync(self, key: str, size: int, timeout_s: float) -> tuple[str, int]:
        """Train rank 0: host the rendezvous of weight-sync group `key` (itself and size - 1 rollout ranks);
        where it listens."""
        host = ray.util.get_node_ip_address()
        self.sync_stores[key] = SyncGroup.store(host, 0, size, True, timeout_s)
        return host, self.sync_stores[key].port

    def join_weight_sync(self, key: str, host: str, port: int, rank: int, size: int, device: str, timeout_s: float,
                         transport: TransportConfig, reshard: ReshardShape | None = None,
                         server: tuple[NcclLayout, str] | None = None) -> None:
        """Join weight-sync group `key` as `rank` (0: train rank 0, which hosts it); `transport` (sync.*) builds
        what moves the weights over it (with `reshard`, the group holds every train rank). With `server` (the
        layout of vLLM's NCCL weight transfer and the follower role): its ServerNcclTransport over the group's
        store instead, rank 0 the trainer, rank r the server of replica r - 1."""
        store = self.sync_stores.pop(key) if rank == 0 else SyncGroup.store(host, port, size, False, timeout_s)
        if server is not None:
            nccl = ServerNcclTransport(store, rank, server[0], transport.bucket_mb << 20, timeout_s)
            nccl.open(ray.util.get_node_ip_address(), None if rank == 0 else self.roles[server[1]].engine)
            self.transports[key] = (nccl, store)
            return
        group = SyncGroup(store, rank, size, device, ray.util.get_node_ip_address(), timeout_s)
        self.transports[key] = (transport.build(apart=True, group=group, reshard=reshard), store)

    def send_weights(self, role: str, key: str) -> dict[str, float]:
        """Every train rank gathers the role's entries one at a time (collective under FSDP2); rank 0 broadcasts
        them in buckets over group `key`. Rank 0's timing and sizes."""
        start = time.perf_counter()
        transport = self.transports[key][0] if key in self.transports else None
        if transport is not None and transport.sends_shards:  # each train rank sends the rows it holds
            return transport.send(self.roles[role].engine.weight_shards())
        tensors = self.roles[role].engine.named_full_tensors()
        if key not in self.transports:  # not rank 0: take part in each gather only
            for _ in tensors:
                pass
            return {}
        stats = self.transports[key][0].send(tensors)
        return {"timing_s/sync": time.perf_counter() - start, "rollout/sync_buckets": stats["buckets"],
                "rollout/sync_mb": stats["bytes"] / (1 << 20)}

    @ray.method(num_returns=2)
    def receive_weights(self, role: str, key: str, version: int) -> tuple[None, dict[str, float]]:
        """A rollout rank: the role's engine loads each bucket from group `key` as it lands (the transport says
        how: flowrl.engines.weights); what the transport logs on this side (the reshard: what it received)."""
        logged = self.transports[key][0].receive_into(self.roles[role].engine)
        self.roles[role].synced_version = version
        return None, logged

    def stream(self, role: str, op: str, *args: Any) -> Any:
        """StreamRunner.<op>(*args) of the role's streamed rollout (flowrl.runtime.ray.streaming), run here so
        the engine samples in this process while the driver trains elsewhere; closing drops the runner."""
        if role not in self.streams:
            self.streams[role] = StreamRunner(self.roles[role])
        out = getattr(self.streams[role], op)(*args)
        if op == "close":
            del self.streams[role]
        return out

    def set_version(self, role: str, version: int) -> None:
        self.roles[role].version = version

    def save(self, role: str, path: str | None) -> Files | None:
        """Into `path` on this node, or (None) into a scratch folder whose files return to the driver."""
        if path is not None:
            return self.roles[role].engine.save(path)
        with scratch() as folder:
            self.roles[role].engine.save(str(folder / role))
            return _written(folder)

    def load(self, role: str, path: str | None, files: Files | None = None,
             digests: dict[str, str] | None = None) -> None:
        """From `path` on this node, each file checked against `digests` (a signed manifest's) where given, or
        (None) from the driver's `files`, checked as the driver read them."""
        if path is not None:
            with sharded_checkpoint.expecting(digests) if digests is not None else contextlib.nullcontext():
                return self.roles[role].engine.load(path)
        with scratch() as folder:
            unpack(files, folder / role)
            self.roles[role].engine.load(str(folder / role))

    def save_pretrained(self, role: str, path: str | None, tokenizer: Any) -> Files | None:
        if path is not None:
            return self.roles[role].engine.save_pretrained(path, tokenizer)
        with scratch() as folder:
            self.roles[role].engine.save_pretrained(str(folder / role), tokenizer)
            return _written(folder)

    def freeze_heap(self) -> None:
        """This worker's heap frozen after the first step (executor.gc_freeze, flowrl.runtime.observe.gc_heap)."""
        gc_heap.freeze_heap()

    def close(self) -> None:
        """The run is over: each role closes as in a local run (flowrl.graph.role.close_role: an engine's
        shutdown, its server, an agent endpoint), then the transports and the process group."""
        for instance in self.roles.values():
            close_role(instance)
        for transport, _ in self.transports.values():
            transport.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _written(scratch_folder: Path) -> Files:
    """What this rank wrote for a folder under `scratch_folder`, relative to that folder: rank 0 leaves it in
    place, while the other ranks of a sharded save may leave their files in the temporary folder that rank 0
    renames on a shared disk (here, only its own); the driver merges every rank's files."""
    return {name.split("/", 1)[1]: data for name, data in pack(scratch_folder).items() if "/" in name}
