"""This process's real peak of device memory, where an in-process vLLM sleeps.

torch counts an allocation of vLLM's sleep-mode pool (its weights, KV cache) as allocated from the engine's build
to its end, also while vLLM sleeps and has unmapped its memory (`LLM.sleep` releases the physical pages behind
tensors that live on). So `torch.cuda.max_memory_allocated()` over an update of a colocated run counts the
sleeping engine's share too: a Qwen2.5-7B shape on an H100 read 108.9 GiB of an 80 GiB card (2026-12-07,
benchmarks/results/planner_h100_20261207/metrics.jsonl; vLLM had freed 37.7 GiB by then).

Between two changes of what is unmapped, what is on the device is torch's count less the unmapped bytes, so
this module cuts the run into such intervals: before each change (`unmapped`) it folds the interval's peak, less
what was unmapped through it, into the run's peak (`run_peak_bytes`) and into each open `phase`, then starts the
next interval by resetting torch's peak. Every reset of torch's peak in the process goes through `fold`, so no
interval's peak is lost. The counters are injectable (`Counters`) so the arithmetic runs on CPU in tests.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from flowrl import metrics
from flowrl.engines.memory import GIB


def _cuda_allocated() -> int:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


def _cuda_peak() -> int:
    return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0


def _cuda_reset() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


@dataclass
class Counters:
    """torch's allocated bytes now, its peak since the last reset, and the reset."""

    allocated: Callable[[], int] = _cuda_allocated
    peak: Callable[[], int] = _cuda_peak
    reset: Callable[[], None] = _cuda_reset


@dataclass
class DevicePeak:
    counters: Counters = field(default_factory=Counters)
    unmapped_bytes: int = 0  # counted by torch, but released by a sleeping engine
    run_peak: int = 0  # the real peak of the intervals folded so far
    open_phases: list[list[int]] = field(default_factory=list)

    def fold(self) -> None:
        """Ends the current interval: its real peak goes into the run's and every open phase's."""
        real = self.counters.peak() - self.unmapped_bytes
        self.run_peak = max(self.run_peak, real)
        for box in self.open_phases:
            box[0] = max(box[0], real)
        self.counters.reset()

    def unmapped(self, change: int) -> None:
        """`change` more bytes of torch's count are unmapped from now on (negative: mapped again)."""
        self.fold()
        self.unmapped_bytes = max(0, self.unmapped_bytes + change)

    def run_peak_bytes(self) -> int:
        self.fold()
        return self.run_peak

    def restart(self) -> None:
        """A new run in this process (a benchmark's next system): the peak starts again from what is on now."""
        self.counters.reset()
        self.run_peak = self.counters.allocated() - self.unmapped_bytes

    @contextlib.contextmanager
    def phase(self) -> Iterator[list[int]]:
        """[peak bytes, bytes on the device when it began], the peak final when the block ends."""
        self.fold()
        start = self.counters.allocated() - self.unmapped_bytes
        box = [start, start]
        self.open_phases.append(box)
        try:
            yield box
        finally:
            self.fold()
            self.open_phases.remove(box)


TRACKER = DevicePeak()


def unmapped(change: int) -> None:
    TRACKER.unmapped(change)


def restart() -> None:
    TRACKER.restart()


def run_peak_gib() -> float:
    """This process's device peak so far, what sleeping engines had unmapped left out."""
    return TRACKER.run_peak_bytes() / GIB


@contextlib.contextmanager
def logged_phase(name: str) -> Iterator[None]:
    """Logs the block's device peak as memory/peak_gib/<name> and how far it rose above what was on the device
    when it began as memory/added_gib/<name> (a sync's buffers, a generation's activations)."""
    with TRACKER.phase() as box:
        yield
    peak, start = box
    metrics.log(f"memory/peak_gib/{name}", peak / GIB)
    metrics.log(f"memory/added_gib/{name}", (peak - start) / GIB)
