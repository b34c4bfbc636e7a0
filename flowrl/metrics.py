"""A per-step metric sink: roles and stages call `log`, the executor collects.

One mechanism for all nodes keeps node functions returning just the batch, so
an algorithm runs the same eagerly (plain calls) and compiled (executor).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import defaultdict
from typing import Iterator

import torch

_SINK: contextvars.ContextVar[dict[str, list[float]] | None] = contextvars.ContextVar("flowrl_metrics", default=None)


def log(name: str, value: float | torch.Tensor) -> None:
    """Record one value of a metric; a no-op outside `collect()`."""
    sink = _SINK.get()
    if sink is None:
        return
    if isinstance(value, torch.Tensor):
        value = value.detach().float().mean().item()
    sink[name].append(float(value))


def log_dict(prefix: str, values: dict[str, float]) -> None:
    for key, value in values.items():
        log(f"{prefix}/{key}", value)


@contextlib.contextmanager
def collect() -> Iterator[dict[str, float]]:
    """Collect metrics logged inside the block; the yielded dict fills on exit with means."""
    sink: dict[str, list[float]] = defaultdict(list)
    result: dict[str, float] = {}
    token = _SINK.set(sink)
    try:
        yield result
    finally:
        _SINK.reset(token)
        result.update({k: sum(v) / len(v) for k, v in sink.items() if v})
