"""Profiling: `debug.profile_steps=[a, b]` runs steps a..b (1-based, as logged) under the torch profiler.

At step b it writes to `output_dir/profile/`: `trace.json` (a Chrome trace: chrome://tracing or
ui.perfetto.dev; each step a `flowrl step N` range, each graph node run in this process a range named
after it), `ops.txt` (the profiler's operator table, by self
time) and `node_times.csv`, the per-node time table: each graph node's seconds over the profiled steps
(the executor's `timing_s/<node>`), its mean per step and its share of the steps' time. CPU activity is
recorded always, CUDA's too on a CUDA run. Under torchrun each rank writes its own files (`.rankR`).
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from flowrl.config import DebugConfig

log = logging.getLogger(__name__)
STEP_KEY = "timing_s/step"


def node_table(steps: list[dict[str, float]]) -> list[dict[str, float | str]]:
    """One row per node of the steps' `timing_s/<node>` metrics: total and mean seconds, share of the steps'."""
    total_step = sum(s.get(STEP_KEY, 0.0) for s in steps)
    names = sorted({k for s in steps for k in s if k.startswith("timing_s/") and k != STEP_KEY})
    table = []
    for name in names:
        total = sum(s.get(name, 0.0) for s in steps)
        table.append({"node": name.removeprefix("timing_s/"), "total_s": total, "mean_s": total / len(steps),
                      "share": total / total_step if total_step else 0.0})
    return sorted(table, key=lambda row: -row["total_s"])


class StepProfiler:
    """Profiles the steps in [first, last]; `steps=()` profiles nothing (every call a no-op)."""

    def __init__(self, steps: tuple[int, ...] | list[int], folder: Path, cuda: bool = False):
        self.first, self.last = (steps[0], steps[1]) if steps else (0, -1)
        self.folder, self.cuda = folder, cuda
        self._prof: profile | None = None
        self._range: record_function | None = None
        self._steps: list[dict[str, float]] = []

    def begin(self, step: int) -> None:
        """Before step `step`: starts the profiler at the range's first step (or a resumed run's first inside it)
        and opens the step's range."""
        if not self.first <= step <= self.last:
            return
        if self._prof is None:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self._prof, self._steps = profile(activities=activities), []
            self._prof.__enter__()
        self._range = record_function(f"flowrl step {step}")
        self._range.__enter__()

    def end(self, step: int, logged: dict[str, float]) -> None:
        """After step `step` with its metrics: closes its range; at the last step, stops and writes the files."""
        if self._prof is None or not self.first <= step <= self.last:
            return
        self._range.__exit__(None, None, None)
        self._steps.append(dict(logged))
        if step == self.last:
            self._prof.__exit__(None, None, None)
            self._write()
            self._prof = None

    def _write(self) -> None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        suffix = f".rank{rank}" if rank else ""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._prof.export_chrome_trace(str(self.folder / f"trace{suffix}.json"))
        by = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"
        (self.folder / f"ops{suffix}.txt").write_text(self._prof.key_averages().table(sort_by=by, row_limit=40))
        table = node_table(self._steps)
        with open(self.folder / f"node_times{suffix}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["node", "total_s", "mean_s", "share"])
            writer.writeheader()
            writer.writerows(table)
        log.info("profile of steps %d-%d in %s: %s", self.first, self.last, self.folder,
                 ", ".join(f"{r['node']} {r['share']:.0%}" for r in table[:5]))


def from_config(debug: DebugConfig, output_dir: Path, device: str) -> StepProfiler:
    """The run's profiler (on `device`, the run's train.device)."""
    return StepProfiler(debug.profile_steps, output_dir / "profile", cuda=device == "cuda"
                        and torch.cuda.is_available())
