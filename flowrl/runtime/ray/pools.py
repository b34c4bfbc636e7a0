"""The Ray executor's pools (flowrl.runtime.ray.executor): the cluster they run on, their workers, and files.

- `init_ray` starts a local cluster (at 127.0.0.1: ray_loopback acts before Ray is imported, at the top) or
  joins one, after a TCP check that something listens at its address.
- `start_pool` starts one `PoolWorker` per rank on its bundle of the pool's placement group, with their
  setup calls in flight.
- `PoolEngine` is a trainable role across its pool's ranks, for flowrl.runtime.store.checkpoint; `write_folder`
  writes the files the workers sent back as a folder on the driver.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.runtime.ray import loopback as ray_loopback

ray_loopback.use_for_a_local_cluster()  # before Ray reads its constants (at import): a local cluster at 127.0.0.1
import ray  # noqa: E402

from flowrl.engines.models.folders import atomic_dir  # noqa: E402
from flowrl.engines.train import sharded_checkpoint  # noqa: E402
from flowrl.plan.placement import Pool  # noqa: E402
from flowrl.runtime.ray import cluster as ray_cluster  # noqa: E402
from flowrl.runtime.ray.cluster import ShippedFolder, pack_checked, unpack  # noqa: E402
from flowrl.runtime.ray.worker import PoolWorker  # noqa: E402


def init_ray(address: str | None = None, **kwargs: Any) -> None:
    """Start (or join: `address`, or RAY_ADDRESS; ray://host:port through Ray Client) a Ray cluster unless this
    process already did. A local one registers its node at 127.0.0.1 and listens there only, when this module
    was imported before Ray (ray_loopback.use_for_a_local_cluster, at the top)."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if not ray.is_initialized():
        if address not in (None, "auto", "local"):
            check_listening(address)
        ray.init(address, **({"include_dashboard": False} if address is None else {}), **kwargs)


CONNECT_TIMEOUT_S = 15.0


def check_listening(address: str) -> None:
    """A cluster address nothing listens on is one line within CONNECT_TIMEOUT_S (ray.init would retry for
    minutes): a TCP connection to its host and port is tried first."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except ValueError:
        raise ValueError(f"RAY_ADDRESS {address!r}: expected host:port or ray://host:port") from None
    except OSError as err:
        raise ValueError(f"RAY_ADDRESS {address!r}: no Ray cluster answers there within {CONNECT_TIMEOUT_S:g} s "
                         f"({err.strerror or type(err).__name__}); start it (ray start --head) or unset "
                         f"RAY_ADDRESS for a local one") from None


@dataclass(frozen=True)
class PoolEngine:
    """One trainable role across its pool's ranks, for flowrl.runtime.store.checkpoint: save and load call every rank."""

    workers: tuple[Any, ...]
    role: str
    ship_files: bool = False  # files travel between the driver's `path` and the workers' scratch folders

    def save(self, path: str) -> None:
        saved = ray.get([w.save.remote(self.role, None if self.ship_files else path) for w in self.workers])
        if self.ship_files:
            write_folder({name: data for files in saved for name, data in files.items()}, path)

    def load(self, path: str) -> None:
        """Inside a signed checkpoint's check (flowrl.runtime.store.checkpoint.verified) the bytes loaded are the
        checked ones: shipped files as this process reads them, a node's own reads against the same digests."""
        digests, folder = sharded_checkpoint.expected(), os.path.abspath(path)
        files = ray.put(pack_checked(Path(folder), digests)) if self.ship_files else None
        try:
            ray.get([w.load.remote(self.role, None if self.ship_files else folder, files, digests)
                     for w in self.workers])
        except ray.exceptions.RayTaskError as err:  # the worker's own error, as a local load raises it
            raise err.cause from None


def start_pool(pool: Pool, group: Any, factory: Any, roles: tuple[str, ...],
               shipped: dict[str, ShippedFolder] | None,
               cpu_threads: int = 0) -> tuple[list[Any], list[ray.ObjectRef]]:
    """The pool's workers, one on each bundle of its placement group, and their setup calls (in flight: the
    ranks meet at the address rank 0 finds on its node)."""
    workers = [ray.remote(PoolWorker).options(**ray_cluster.worker_options(pool, group, rank)).remote()
               for rank in range(pool.world_size)]
    address = workers[0].rendezvous.remote()
    setups = [w.setup.remote(factory, roles, pool.device, rank, pool.world_size, address, shipped, cpu_threads)
              for rank, w in enumerate(workers)]
    return workers, setups


def write_folder(files: dict[str, bytes], path: str) -> None:
    """Files the workers sent, written as folder `path` on the driver (whole or not at all)."""
    with atomic_dir(path) as tmp:
        unpack(files, tmp)
