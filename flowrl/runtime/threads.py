"""How many threads torch's CPU ops use in one process (executor.cpu_threads), set once as the process starts.

torch's default is one OpenMP thread per core of the machine. Each torchrun rank,
each Ray worker and any job beside them then competes for the same cores, and an
OpenMP thread spinning at a barrier while its partner waits for a core costs more
than the split gives: 10 steps of the quick start on a busy 2-core machine took
222 s (47 s of CPU) on torch's default of 2 threads and 31-110 s (7-11 s of CPU)
on one, the same rewards (docs/benchmarks.md, "CPU threads").

The choice, first that applies: executor.cpu_threads when above 0; an explicit
OMP_NUM_THREADS (torchrun sets 1 for several ranks, Ray sets one per worker's
whole CPUs, so at least 1); 1 for the built-in tiny model, whose matrices are
too small to split; else the cores of this process's CPU affinity shared among
the ranks on its node (LOCAL_WORLD_SIZE).
"""

from __future__ import annotations

import os

import torch


def cpu_threads(requested: int = 0, *, tiny_model: bool = False, ranks_on_node: int | None = None) -> int:
    """The thread count for this process (see the module docstring); `ranks_on_node` defaults to torchrun's
    LOCAL_WORLD_SIZE (1 without torchrun)."""
    if requested > 0:
        return requested
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp)
    if tiny_model:
        return 1
    ranks = ranks_on_node or int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    return max(1, len(os.sched_getaffinity(0)) // max(1, ranks))


def set_cpu_threads(requested: int = 0, *, tiny_model: bool = False, ranks_on_node: int | None = None) -> int:
    """Sets torch's intra-op threads to `cpu_threads(...)` (only if they differ: vLLM's CPU backend refuses
    later changes with a warning) and returns the count."""
    threads = cpu_threads(requested, tiny_model=tiny_model, ranks_on_node=ranks_on_node)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
