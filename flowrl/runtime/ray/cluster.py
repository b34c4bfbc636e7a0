"""Pools on a Ray cluster: placement groups, the rendezvous, and folders moved between the driver and the nodes.

- Each pool is a placement group of one bundle per rank (`Pool.strategy`: PACK by default, so a pool larger
  than a node continues on the next); a bundle asks for a sliver of a CPU (`BUNDLE_NUM_CPUS`), one GPU on
  CUDA pools, and the pool's own `resources` (a custom resource a node was started with pins the pool there).
  Before anything waits, the cluster's totals and nodes are checked (`check_cluster`); a group Ray still has
  not placed after executor.placement_timeout_s is a PlanError naming the pool, its bundles and the nodes —
  never a hang.
- The ranks of a pool meet at rank 0's node address on a port free there (rank 0 finds both: `PoolWorker
  .rendezvous`).
- With executor.ship_files, model folders travel through the object store (`ShippedFolder`: each node unpacks
  one copy under its temp folder), and checkpoints and exports come back as files the driver writes where
  the run config says: no node needs to see the driver's disk.
- A local cluster flowrl starts stays at 127.0.0.1 (flowrl.runtime.ray.loopback, set before Ray is imported).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from flowrl.engines.train import sharded_checkpoint
from flowrl.errors import PlanError
from flowrl.plan.placement import Pool

BUNDLE_NUM_CPUS = 0.01  # per rank: Ray refuses empty bundles; torch still uses OMP_NUM_THREADS (Ray sets 1)
SHIPPED_DIR = "flowrl-shipped"  # under each node's temp folder
Files = dict[str, bytes]  # a folder's files by relative path


CLIENT_ATTEMPTS = 3  # Ray Client's server for this connection may die at start (connect's docstring)


def connect(address: str, **kwargs: Any) -> Any:
    """Drive a Ray cluster from this process (a notebook): `ray://head:10001` (Ray Client) or `head:6379` (the
    cluster's GCS, from a machine on its network). Then `train` with executor.name=ray runs its loop here and
    its pools on the cluster: the step lines, progress and metrics come back here, and checkpoints and exports
    land on this machine's disk (executor.ship_files). Functions and classes defined here (algorithms, stages,
    tasks, reward functions) travel by value; modules they import must be installed on the cluster's nodes or
    sent with runtime_env={"py_modules": [...]}. `kwargs` go to ray.init; an earlier connection is closed.

    Ray Client's proxy starts a server per connection on the first port of 23000-23999 that a bind on 0.0.0.0
    finds free; one left listening on 127.0.0.1 by another cluster on the head's machine passes that check, and
    the new server dies at start ("Initialization failure from server"). The proxy moves on to the next port, so
    that failure is tried again, CLIENT_ATTEMPTS times in all, 2 s apart."""
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"connect: address {address!r}; expected 'ray://host:port' or 'host:port'")
    for attempt in range(CLIENT_ATTEMPTS):
        if ray.is_initialized():
            ray.shutdown()
        try:
            return ray.init(address.strip(), **kwargs)
        except ModuleNotFoundError as err:  # Ray Client needs grpcio
            raise ValueError(f"connect {address}: Ray Client needs {err.name}: pip install -e '.[ray]'") from None
        except ConnectionError as err:
            if "Initialization failure from server" in str(err) and attempt < CLIENT_ATTEMPTS - 1:
                time.sleep(2)
                continue
            raise ValueError(f"connect {address}: {' '.join(str(err).split())}; is the head running "
                             f"(ray start --head --ray-client-server-port=PORT) and its port reachable?") from None


def bundle(pool: Pool) -> dict[str, float]:
    """What one rank of the pool asks Ray for."""
    return {"CPU": BUNDLE_NUM_CPUS, **({"GPU": float(pool.gpus_per_rank)} if pool.device == "cuda" else {}),
            **pool.resources}


def check_cluster(pools: list[Pool]) -> None:
    """A PlanError naming the pool, what it needs and what exists, when the cluster cannot host the pools."""
    total = ray.cluster_resources()
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    need: dict[str, float] = {}
    for pool in pools:
        for name, amount in bundle(pool).items():
            need[name] = need.get(name, 0.0) + amount * pool.world_size
            if need[name] > total.get(name, 0) + 1e-9:
                raise PlanError(f"placement: pool {pool.name!r} needs {pool.world_size * amount:g} {name} "
                                f"({amount:g} per rank, {need[name]:g} for the pools so far), but the Ray "
                                f"cluster has {total.get(name, 0):g}{_named_resources(total)}")
        fit = sum(all(node.get(k, 0) >= v for k, v in bundle(pool).items()) for node in nodes)
        if pool.strategy == "STRICT_SPREAD" and fit < pool.world_size:
            raise PlanError(f"placement: pool {pool.name!r} spreads {pool.world_size} ranks over as many nodes "
                            f"(STRICT_SPREAD), but only {fit} of the cluster's {len(nodes)} nodes have "
                            f"{bundle(pool)}")


def place(pools: list[Pool], timeout_s: float) -> dict[str, PlacementGroup]:
    """One placement group per pool, once Ray has placed them all (a PlanError after `timeout_s`)."""
    run = uuid.uuid4().hex[:8]  # names stay unique when several runs share a cluster
    groups = {pool.name: placement_group([bundle(pool)] * pool.world_size, strategy=pool.strategy,
                                         name=f"flowrl-{pool.name}-{run}") for pool in pools}
    refs = {pool.name: groups[pool.name].ready() for pool in pools}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    if len(ready) < len(refs):
        waiting = next(pool for pool in pools if refs[pool.name] not in ready)
        release(groups)
        nodes = "; ".join(f"{i}: {_brief(n['Resources'])}" for i, n in enumerate(ray.nodes()) if n.get("Alive"))
        raise PlanError(f"placement: Ray did not place pool {waiting.name!r} ({waiting.world_size} x "
                        f"{bundle(waiting)}, {waiting.strategy}) within executor.placement_timeout_s={timeout_s:g} s; "
                        f"the cluster's nodes have {nodes or 'nothing'} (other jobs may hold them)")
    return groups


def release(groups: dict[str, PlacementGroup]) -> None:
    for group in groups.values():
        remove_placement_group(group)


def worker_options(pool: Pool, group: PlacementGroup, rank: int) -> dict[str, Any]:
    """Actor options putting rank `rank` of the pool on its bundle."""
    return dict(num_cpus=BUNDLE_NUM_CPUS, num_gpus=pool.gpus_per_rank if pool.device == "cuda" else 0,
                resources=dict(pool.resources),
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank))


def gpu_memory() -> int | None:
    """Bytes of memory of one of the cluster's GPUs (asked of a one-GPU task); None when it has none."""
    if not ray.cluster_resources().get("GPU"):
        return None

    def total() -> int:
        import torch

        return torch.cuda.get_device_properties(0).total_memory

    return ray.get(ray.remote(num_gpus=1, num_cpus=BUNDLE_NUM_CPUS)(total).remote())


@dataclass(frozen=True)
class ShippedFolder:
    """A driver's folder in the object store; `local()` on any node gives a copy there."""

    digest: str
    files: ray.ObjectRef  # Files

    @classmethod
    def put(cls, folder: Path) -> "ShippedFolder":
        files = pack(folder)
        digest = hashlib.sha256(str(folder.resolve()).encode())
        for name in sorted(files):
            digest.update(name.encode() + hashlib.sha256(files[name]).digest())
        return cls(digest.hexdigest()[:16], ray.put(files))

    def local(self) -> Path:
        """This node's copy (unpacked once per node; ranks sharing a node share it)."""
        dest = Path(tempfile.gettempdir()) / SHIPPED_DIR / self.digest
        if not dest.is_dir():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{self.digest}-"))
            unpack(ray.get(self.files), tmp)
            try:
                os.replace(tmp, dest)
            except OSError:  # another rank of this node was first
                shutil.rmtree(tmp, ignore_errors=True)
        return dest


def ship(folders: tuple[Path, ...]) -> dict[str, ShippedFolder]:
    """The folders in the object store, by their driver path."""
    return {str(folder): ShippedFolder.put(folder) for folder in dict.fromkeys(folders)}


def pack(folder: Path) -> Files:
    """Every file under `folder` ({} when it does not exist)."""
    if not folder.is_dir():
        return {}
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def pack_checked(folder: Path, digests: dict[str, str] | None) -> Files:
    """pack(), but under a signed checkpoint's digests (sharded_checkpoint.expected()) each file's bytes are read
    once and shipped only if they are the ones its manifest lists; a file it does not list stays behind."""
    if digests is None:
        return pack(folder)
    return {str(p.relative_to(folder)): sharded_checkpoint.read_checked(p, digests)
            for p in sorted(folder.rglob("*")) if os.path.abspath(p) in digests}


def unpack(files: Files, folder: Path) -> None:
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


@contextmanager
def scratch() -> Iterator[Path]:
    """A folder on this node, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="flowrl-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _brief(resources: dict[str, float]) -> str:
    keep = {k: v for k, v in resources.items() if not k.startswith(("node:", "memory", "object_store_memory"))}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(keep.items())) + "}"


def _named_resources(total: dict[str, float]) -> str:
    return f" (it has {_brief(total)})"
