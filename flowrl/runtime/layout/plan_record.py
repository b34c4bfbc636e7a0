"""A run's plan against what it measured: with `plan.predicted` (written by `flowrl plan --cluster --write`),
each step's metrics row gets the predicted step time and peak memory and the measured over predicted ratios
(flowrl.plan.calibrate.compare; `memory/peak_gib` is this rank's device peak: CUDA's allocated peak less what a
sleeping vLLM had unmapped (flowrl.engines.device_peak), on CPU the process's peak resident memory), and the run folder holds plan.json: the prediction, the measured medians and
the cost model refined from the run's own steps, which `flowrl plan --costs RUN/plan.json` plans with next.
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import torch

from flowrl.engines import device_peak
from flowrl.engines.memory import GIB
from flowrl.plan.calibrate import PEAK, Prediction, compare, record

FILE = "plan.json"


def device_peak_gib(device: str) -> float:
    """This process's peak memory so far: on the device (CUDA's allocated peak, a sleeping vLLM's unmapped pool
    left out), else its peak resident set."""
    if device == "cuda" and torch.cuda.is_available():
        return device_peak.run_peak_gib()
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
