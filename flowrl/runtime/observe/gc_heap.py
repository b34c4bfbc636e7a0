"""Python's garbage collector in a training process: the time it takes per node, and the heap frozen after the
first step (executor.gc_freeze).

CPython's oldest-generation collections walk every container object the process holds. A training process holds
millions that live as long as it does: the models' modules, torch.compile's graphs, guards and sympy expressions
(made in the first step), tokenizers, vLLM's engine. A rollout on vLLM in the same process makes a few Python
objects per token, and each collection they trigger walks that whole heap again. vLLM freezes the heap it made
at start-up (vllm.utils.gc_utils.freeze_gc_heap; SGLang does the same), but not what the trainer makes after. On
the H200 (docs/benchmarks.md, 2026-12-04, sixth session) freezing after the first step took hf_static's GRPO step
(64x8, variable lengths) from 3.19 to 2.92 s, and the vLLM engine's (fixed lengths) from 5.82 to 5.61 s, its
sleep (a full collection) from 0.13-0.21 to 0.09-0.11 s.

The local executor freezes its process after its first step; the Ray executor has each worker freeze its own
(flowrl.runtime.ray.nodes.freeze_heaps). `freeze_heap()` collects once and moves every object tracked then
into the permanent generation, which no later collection walks (gc.freeze). Objects made later are collected as
usual; a frozen object is still freed when its last reference goes, so only reference cycles among frozen objects
wait: `thaw_heap()` (at the executor's close, when its freeze was the first) hands them back to the collector. `GcClock` adds up the collector's seconds,
logged per node as `timing_s/gc/<node>`.
"""

from __future__ import annotations

import gc
import time


class GcClock:
    """The seconds this process has spent in garbage collection since `install()` (a gc.callbacks entry)."""

    def __init__(self) -> None:
        self.seconds, self.collections, self._start = 0.0, 0, 0.0

    def install(self) -> "GcClock":
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        return self

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections += 1


CLOCK = GcClock()  # one per process: installed by the first executor that reads it


def freeze_heap() -> bool:
    """Collects every generation, then freezes what is left. True when nothing was frozen before: the caller then
    owns the thaw. Otherwise whoever froze first does (gc.unfreeze thaws all: vLLM's shutdown does, and the
    tests' conftest freezes the imports)."""
    first = gc.get_freeze_count() == 0
    gc.collect()
    gc.freeze()
    return first


def thaw_heap() -> None:
    """Hands the frozen objects back to the collector's oldest generation (gc.unfreeze)."""
    gc.unfreeze()
