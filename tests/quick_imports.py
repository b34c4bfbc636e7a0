"""Imports with the cycle collector off, for the processes the tests start (Ray workers, torchrun ranks).

Importing torch, transformers, tensordict and flowrl creates ~450,000 objects, and the collector's full passes
over them as they pile up are ~1 s of the ~6 s such an import takes (flowrl.runtime.ray.worker on the 2-core
machine: 5.1 s against 6.1 s of CPU, vLLM's modules alike). The suite starts well over a hundred such
processes. The collector is back on before anything else runs: the process holds the objects its own import
would have left, and collects as before.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """The block runs with the cycle collector off; it is on again after it, if it was on before it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def import_flowrl_worker() -> None:
    """The setup hook of the session's local Ray cluster (conftest.ray_local): what unpickling the pool worker's
    class imports anyway, imported before it."""
    with collector_off():
        import flowrl.runtime.ray.worker  # noqa: F401
