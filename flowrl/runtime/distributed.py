"""SPMD runs under torchrun: every rank runs the local executor on its own prompts.

With WORLD_SIZE > 1 in the environment the trainer joins the process group
(gloo on CPU, NCCL on CUDA); train engines then shard with FSDP2 and each rank
keeps an unsharded rollout copy that the weight sync refreshes.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def setup(device: str, timeout_s: float | None = None) -> tuple[int, int]:
    """Join the process group torchrun describes, if any; returns (rank, world_size). `timeout_s`
    (executor.node_timeout_s): a collective some rank has not joined within it fails (torch's default: 10 min)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    if not dist.is_initialized():
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        timeout = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
        dist.init_process_group("nccl" if device == "cuda" else "gloo", **timeout)
    return dist.get_rank(), dist.get_world_size()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def mean_over_ranks(logged: dict[str, float]) -> dict[str, float]:
    """Each metric averaged over the ranks that logged it (collective)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return logged
    gathered: list[dict[str, float] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, logged)
    return average(gathered)


def sum_over_ranks(value: int) -> int:
    """`value` summed over the ranks (collective: an object gather, which gloo and NCCL both carry)."""
    return sum(gather_objects(value))


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (collective; [obj] without a process group)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def average(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each metric averaged over the rows (ranks) that hold it."""
    keys = {k for row in rows for k in row}
    return {k: sum(row[k] for row in rows if k in row) / sum(k in row for row in rows) for k in sorted(keys)}


def check_rendezvous(timeout_s: float) -> None:
    """Under torchrun, before joining: the environment is consistent (0 <= RANK < WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT set) and, on ranks other than 0, the master answers within `timeout_s`
    (executor.rendezvous_timeout_s); else one line naming the variable or the address, instead of torch's
    ten-minute wait."""
    env = os.environ
    if env.get("WORLD_SIZE", "1") == "1" and env.get("RANK", "0") == "0":
        return
    try:  # RANK=1 alone is a rank whose job is missing, not a run of one (it would train without the lock)
        rank, world = int(env.get("RANK", "")), int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ValueError(f"RANK={env.get('RANK')!r}, WORLD_SIZE={env.get('WORLD_SIZE')!r}: expected whole "
                         f"numbers (torchrun sets them)") from None
    if "WORLD_SIZE" not in env:
        raise ValueError(f"RANK={rank} without WORLD_SIZE: a rank of a torchrun job needs the job's WORLD_SIZE, "
                         f"MASTER_ADDR and MASTER_PORT (torchrun sets them); a run of one process sets no RANK")
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is outside WORLD_SIZE={world}: ranks are 0..{world - 1}")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    if missing:
        raise ValueError(f"{missing[0]} is not set: WORLD_SIZE={world} needs the master's address (torchrun sets it)")
    if rank > 0:
        _wait_for_master(env["MASTER_ADDR"], int(env["MASTER_PORT"]), timeout_s)


def _wait_for_master(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())).close()
            return
        except OSError as err:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the torchrun master {host}:{port} (MASTER_ADDR:MASTER_PORT) did not answer "
                                   f"within executor.rendezvous_timeout_s={timeout_s:g} ({err.strerror or err}); is "
                                   f"rank 0 running?") from None
            time.sleep(0.2)


def per_rank(total: int, world: int, field: str) -> int:
    if total % world:
        raise ValueError(f"{field}={total} must be divisible by the world size {world}")
    return total // world
