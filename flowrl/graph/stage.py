"""`@stage`: a pure batch -> batch function that is also a graph node.

Called on a TensorDict it just runs; called on a traced batch it records a
node with the fields it reads and writes. Works bare or with arguments, keeps
the wrapped signature, and `.options(**kw)` returns a copy with kwargs bound.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from tensordict import TensorDict

from flowrl.errors import GraphError
from flowrl.graph.trace import Fields, NodeKind, Spec, SymBatch, check_call


class Stage:
    def __init__(self, fn: Callable[..., TensorDict], spec: Spec, bound: dict[str, Any] | None = None):
        self.fn, self.spec, self.bound = fn, spec, dict(bound or {})
        functools.update_wrapper(self, fn)

    @property
    def name(self) -> str:
        return self.fn.__name__

    def options(self, **kwargs: Any) -> "Stage":
        return Stage(self.fn, self.spec, {**self.bound, **kwargs})

    def __call__(self, batch: Any, **kwargs: Any) -> Any:
        kwargs = {**self.bound, **kwargs}
        if isinstance(batch, SymBatch):
            check_call(f"stage {self.name}", self.fn, batch, **kwargs)
            if self.spec.check is not None:
                self.spec.check(**kwargs)
            return batch.tracer.record(batch, self.name, self.spec, kwargs, fn=self.fn)
        if not isinstance(batch, TensorDict):
            raise GraphError(f"stage {self.name} got {type(batch).__name__}, expected a TensorDict batch")
        return self.fn(batch, **kwargs)

    def __repr__(self) -> str:
        return f"Stage({self.name})"


def stage(fn: Callable | None = None, *, reads: Fields = (), writes: Fields = (), rows: bool = False):
    """Decorate a batch function; `rows=True` when it drops or reorders rows."""
    spec = Spec(reads=reads, writes=writes, kind=NodeKind.ROWS if rows else NodeKind.MAP)
    if fn is not None:
        return Stage(fn, spec)
    return lambda f: Stage(f, spec)


def _fill(batch: TensorDict, num_groups: int | None = None, max_rounds: int = 4) -> TensorDict:
    """Eagerly a no-op; the executor re-runs the nodes before it until full."""
    return batch


fill = Stage(_fill, Spec(reads=("group",), kind=NodeKind.FILL))
fill.__doc__ = """Dynamic sampling: keep sampling fresh prompts through the nodes before this one
until `num_groups` groups survive (default: the step's prompt count; both over all
ranks), at most `max_rounds` rounds; the batch is then cut to the first that many
groups in uid order. At world size > 1 the surviving groups of every rank are
gathered, cut to a multiple of the world size and dealt out evenly, so a run
trains on the same rows at any world size (flowrl.runtime.scheduling)."""


def buffer(batch: TensorDict, max_staleness: int = 0, stream: bool = False) -> TensorDict:
    """Eagerly a no-op; executors run the nodes before it ahead of those after it (flowrl.runtime.offpolicy.buffering)."""
    return batch


def _check_buffer(max_staleness: int = 0, stream: bool = False) -> None:
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
        raise GraphError(f"buffer: max_staleness must be an int >= 0, got {max_staleness!r}")
    if not isinstance(stream, bool):
        raise GraphError(f"buffer: stream must be a bool, got {stream!r}")


buffer = Stage(buffer, Spec(reads=("policy_version",), kind=NodeKind.BUFFER, check=_check_buffer))
buffer.__doc__ = """Bounded staleness: the nodes before this one (generate, score: the producers) may run up
to `max_staleness` steps ahead of the nodes after it (logprobs, update: the consumers). With
`max_staleness=k >= 1` the batch trained at step t was sampled with the weights of k updates earlier, and an
executor with the rollout on its own pool generates step t+k's batch while step t trains (k = 1 is verl's
one-step-off-policy). Rows whose `policy_version` lags the trained weights by more than k are dropped and
counted (`buffer/dropped`). `max_staleness=0` is the synchronous step exactly. `stream=True` samples each
response on its own and trains on the first groups to finish, k bounding each sample's versions
(flowrl.runtime.offpolicy.streaming; the local executor)."""
