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

The built-in tiny model on CPU also pins the CPU kernels (`pin_cpu_kernels`): torch's own vectorized
kernels and MKL's both pick their code by the CPU's instruction set, and 50 steps of RL carry the rounding
apart (the quick start on one AVX2 machine: 0.551 at the last step; with ATen's scalar kernels
(ATEN_CPU_CAPABILITY=default) 0.746, with MKL's portable path (MKL_CBWR=COMPATIBLE) 0.730; oneDNN's ISA and
one or two threads changed nothing). Pinned to AVX2 (ATEN_CPU_CAPABILITY=avx2, MKL_CBWR=AVX2), an AVX-512
machine runs the same code as an AVX2 one; a variable the user set wins. The pin is kept only where it took effect
in this process: ATen reads its variable once, at its first op, and a process that had already run ops (a notebook,
a test session) keeps its own kernels, so the variables are taken back rather than handed to the processes it
starts (Ray workers, servers), which would otherwise round differently from it: a Ray run parted from the same
run in-process by 1.7e-5 in the weights after 3 steps when an earlier run of the session had pinned them.
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


CPU_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}  # what every x86-64 CPU with AVX2 runs alike


def pin_cpu_kernels() -> dict[str, str]:
    """Sets CPU_KERNELS in the environment where unset, on a CPU with AVX2 (Linux's /proc/cpuinfo), and returns
    what it set; nothing (and the environment as it was) where ATen in this process already runs other kernels
    than AVX2's. torch and MKL read them at their first op: call it before any model is built."""
    try:
        with open("/proc/cpuinfo") as info:
            avx2 = " avx2 " in f" {info.read(1 << 16).replace(chr(10), ' ')} "
    except OSError:
        return {}
    pinned = {key: value for key, value in CPU_KERNELS.items() if avx2 and key not in os.environ}
    os.environ.update(pinned)
    if "ATEN_CPU_CAPABILITY" in pinned and torch.backends.cpu.get_cpu_capability() != "AVX2":  # read before us
        for key in pinned:
            del os.environ[key]
        return {}
    return pinned


def set_cpu_threads(requested: int = 0, *, tiny_model: bool = False, ranks_on_node: int | None = None) -> int:
    """Sets torch's intra-op threads to `cpu_threads(...)` (only if they differ: vLLM's CPU backend refuses
    later changes with a warning) and returns the count."""
    threads = cpu_threads(requested, tiny_model=tiny_model, ranks_on_node=ranks_on_node)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
