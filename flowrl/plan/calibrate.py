"""Predicted against measured: the prediction a plan hands its run, what the run measured, and the cost model
refined from the run's own steps for the next plan.

`Prediction` is what `flowrl plan --write` puts in the run config (`plan.predicted`): the chosen layout's step
time, each node's seconds and cost category, each pool's peak memory per GPU, and the cost model it came from.
`measured` reads a run's metrics rows: the median over its steps (the first left out: it compiles, or fills the
buffer) of `timing_s/step` and each `timing_s/<node>`, and the highest `memory/peak_gib`. `refine` scales each
category by measured over predicted (CostModel.refine) and sets the step's own overhead to what the measured
step takes beyond its nodes, simulated on the same layout with the measured node seconds.
"""

from __future__ import annotations

import statistics
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flowrl.engines.memory import GIB
from flowrl.plan.candidates import Candidate
from flowrl.plan.choose import Scored
from flowrl.plan.costs import DEVICES, CostModel
from flowrl.plan.simulate import GraphNode, step_seconds

STEP, PEAK = "timing_s/step", "memory/peak_gib"


class NodeCost(BaseModel):
    """One node of the plan as the simulator saw it, with its predicted seconds."""

    model_config = ConfigDict(extra="forbid")
    name: str
    category: str = Field(description="generate, forward, update, sync or driver")
    side: str = Field(description="gen, train or driver")
    deps: list[str] = Field(default_factory=list)
    before_buffer: bool = True
    seconds: float = Field(0.0, ge=0)

    def node(self) -> GraphNode:
        return GraphNode(self.name, self.category, self.side, tuple(self.deps), self.before_buffer)


class Prediction(BaseModel):
    """What the planner predicted for the layout a run carries out."""

    model_config = ConfigDict(extra="forbid")
    layout: str = Field("", description="The chosen candidate's label.")
    device: str = Field("H100-80G", description="The device table's row the costs are for.")
    step_s: float = Field(ge=0, description="Predicted seconds a step.")
    peak_gib: dict[str, float] = Field(default_factory=dict, description="Predicted peak GiB per GPU of each pool.")
    nodes: list[NodeCost] = Field(default_factory=list)
    colocated: bool = True
    buffer_depth: int = Field(0, ge=0)
    scale: dict[str, float] = Field(default_factory=dict, description="The cost model's category scales in force.")
    fixed_s: float | None = Field(None, description="The cost model's step overhead, where refined.")

    def costs(self) -> CostModel:
        return CostModel(DEVICES[self.device], tuple(sorted(self.scale.items())), self.fixed_s)


class PlanSection(BaseModel):
    """The plan a run carries out (the run config's `plan` section)."""

    model_config = ConfigDict(extra="forbid")
    predicted: Prediction | None = Field(None, description="The planner's prediction for this layout (flowrl plan "
                                                           "--cluster --write puts it here); the run logs plan/* "
                                                           "against it and writes plan.json.")


def measured(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Median step and node seconds over a run's steps (the first left out where there are more), highest peak."""
    steps = [r for r in rows if STEP in r]
    steps = steps[1:] or steps
    times = sorted({k for r in steps for k in r if k.startswith("timing_s/") and k != STEP})
    peaks = [r[PEAK] for r in rows if PEAK in r]
    return {"step_s": statistics.median(r[STEP] for r in steps) if steps else None,
            "node_s": {k.removeprefix("timing_s/"): statistics.median(r[k] for r in steps if k in r) for k in times},
            "peak_gib": max(peaks) if peaks else None}


def compare(pred: Prediction, row: dict[str, float]) -> dict[str, float]:
    """A step's metrics: predicted and measured step time and peak memory, and measured over predicted."""
    out = {"plan/predicted_step_s": pred.step_s}
    if STEP in row and pred.step_s > 0:
        out["plan/step_ratio"] = row[STEP] / pred.step_s
    if pred.peak_gib:
        out["plan/predicted_peak_gib"] = max(pred.peak_gib.values())
        if PEAK in row:
            out["plan/peak_ratio"] = row[PEAK] / out["plan/predicted_peak_gib"]
    return out


def refine(pred: Prediction, rows: list[dict[str, float]]) -> CostModel:
    """The prediction's cost model scaled by what the run measured (each category, and the step's overhead)."""
    predicted = {n.name: n.seconds for n in pred.nodes}
    categories = {n.name: n.category for n in pred.nodes}
    model = pred.costs().refine(predicted, rows, categories)
    got = measured(rows)
    seen = got["node_s"]
    if got["step_s"] is None or not pred.nodes or any(n.name not in seen for n in pred.nodes):
        return model
    nodes = [n.node() for n in pred.nodes]
    layout = Candidate(1, 0 if pred.colocated else 1)  # what step_seconds reads of it: one pool or two
    span = step_seconds(nodes, {n.name: seen[n.name] for n in nodes}, layout, pred.buffer_depth, 0.0)
    return CostModel(model.device, model.scale, max(0.0, got["step_s"] - span))


def predict(best: Scored, nodes: list[GraphNode], depth: int, costs: CostModel, device: str) -> Prediction:
    """The Prediction of a scored candidate (its node seconds, pools' peaks) under `costs`."""
    seconds = dict(best.node_s)
    return Prediction(layout=best.cand.label(), device=device, step_s=best.seconds or 0.0,
                      peak_gib={pool: b / GIB for pool, b in best.fit.peak.items()},
                      nodes=[NodeCost(name=n.name, category=n.category, side=n.side, deps=list(n.deps),
                                      before_buffer=n.before_buffer, seconds=seconds.get(n.name, 0.0)) for n in nodes],
                      colocated=best.cand.colocated, buffer_depth=depth if not best.cand.colocated else 0,
                      scale=dict(costs.scale), fixed_s=costs.fixed_s)


def record(pred: Prediction, rows: list[dict[str, float]]) -> dict[str, Any]:
    """plan.json of a run: the prediction, the measured figures and the refined cost model (scales, overhead)."""
    got, model = measured(rows), refine(pred, rows)
    predicted_nodes = {n.name: n.seconds for n in pred.nodes}
    return {"predicted": pred.model_dump(mode="json"),
            "measured": {**got, "node_ratio": {k: got["node_s"][k] / v for k, v in predicted_nodes.items()
                                               if v > 0 and k in got["node_s"]}},
            "refined": {"device": pred.device, "scale": dict(model.scale), "fixed_s": model.fixed_s}}


def load_refined(path: str) -> CostModel:
    """The refined cost model a run wrote (plan.json's `refined`), for the next plan (flowrl plan --costs)."""
    import json
    from pathlib import Path

    try:
        data = json.loads(Path(path).read_text())["refined"]
        return CostModel(DEVICES[data["device"]], tuple(sorted(data["scale"].items())), data.get("fixed_s"))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"--costs {path}: not a run's plan.json with a 'refined' cost model ({err})") from None
