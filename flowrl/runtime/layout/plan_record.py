"""A run's plan against what it measured: with `plan.predicted` (written by `flowrl plan --cluster --write`),
each step's metrics row gets the predicted step time and peak memory and the measured over predicted ratios
(flowrl.plan.calibrate.compare; `memory/peak_gib` is this rank's device peak: CUDA's allocated peak, on CPU the
process's peak resident memory), and the run folder holds plan.json: the prediction, the measured medians and
the cost model refined from the run's own steps, which `flowrl plan --costs RUN/plan.json` plans with next.
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import torch

from flowrl.engines.memory import GIB
from flowrl.plan.calibrate import PEAK, Prediction, compare, record

FILE = "plan.json"


def device_peak_gib(device: str) -> float:
    """This process's peak memory so far: CUDA's allocated peak, else its peak resident set."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux reports KiB


class PlanRecord:
    """Adds plan/* to each step's row and keeps the run folder's plan.json current (rank 0 writes it)."""

    def __init__(self, pred: Prediction, out: Path, device: str, main: bool):
        self.pred, self.path, self.device, self.main = pred, out / FILE, device, main

    def step(self, logged: dict[str, float], history: list[dict[str, float]]) -> None:
        logged[PEAK] = device_peak_gib(self.device)
        logged.update(compare(self.pred, logged))
        if self.main:
            tmp = self.path.with_name(f".{FILE}.tmp")
            tmp.write_text(json.dumps(record(self.pred, [*history, logged]), indent=2) + "\n")
            os.replace(tmp, self.path)
