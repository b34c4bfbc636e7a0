"""A per-step metric sink: roles and stages call `log`, the executor collects.

One mechanism for all nodes keeps node functions returning just the batch, so
an algorithm runs the same eagerly (plain calls) and compiled (executor).
Executors run each node inside `node(name)`: values one node logs under one
name several times (over dynamic-sampling rounds, or micro-batches) are
averaged, but when two nodes (two calls of one role method, say) log the same
name, the first keeps it and the later ones get `name#2`, `name#3`, ...
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Iterator

import torch

_SINK: contextvars.ContextVar[dict[str, dict[str, list[float]]] | None] = contextvars.ContextVar(
    "flowrl_metrics", default=None)
_NODE: contextvars.ContextVar[str] = contextvars.ContextVar("flowrl_metrics_node", default="")


def log(name: str, value: float | torch.Tensor) -> None:
    """Record one value of a metric; a no-op outside `collect()`."""
    sink = _SINK.get()
    if sink is None:
        return
    if isinstance(value, torch.Tensor):
        value = value.detach().float().mean().item()
    sink.setdefault(name, {}).setdefault(_NODE.get(), []).append(float(value))


class Laps:
    """Logs the seconds since the last lap (or since made) under `prefix` + the lap's name."""

    def __init__(self, prefix: str):
        self.prefix, self.last = prefix, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        log(self.prefix + name, now - self.last)
        self.last = now


def log_dict(prefix: str, values: dict[str, float]) -> None:
    for key, value in values.items():
        log(f"{prefix}/{key}", value)


@contextlib.contextmanager
def node(name: str) -> Iterator[None]:
    """Metrics logged inside the block belong to graph node `name`."""
    token = _NODE.set(name)
    try:
        yield
    finally:
        _NODE.reset(token)


@contextlib.contextmanager
def record() -> Iterator[dict[str, dict[str, list[float]]]]:
    """What the block logs, kept raw (name -> node -> values) and not passed on: `replay` logs it later (a
    streamed group's metrics go to the step that trains it)."""
    sink: dict[str, dict[str, list[float]]] = {}
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)


def replay(recorded: dict[str, dict[str, list[float]]], prefix: str = "") -> None:
    """Logs `record`'s values again, under their nodes and `prefix` + name; a no-op outside `collect()`."""
    sink = _SINK.get()
    if sink is None:
        return
    for name, by_node in recorded.items():
        for node_name, values in by_node.items():
            sink.setdefault(prefix + name, {}).setdefault(node_name, []).extend(values)


@contextlib.contextmanager
def collect() -> Iterator[dict[str, float]]:
    """Collect metrics logged inside the block; the yielded dict fills on exit with means."""
    sink: dict[str, dict[str, list[float]]] = {}
    result: dict[str, float] = {}
    token = _SINK.set(sink)
    try:
        yield result
    finally:
        _SINK.reset(token)
        for name, by_node in sink.items():
            for i, values in enumerate(by_node.values()):
                result[name if i == 0 else f"{name}#{i + 1}"] = sum(values) / len(values)
