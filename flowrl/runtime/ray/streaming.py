"""Streamed rollouts on the Ray executor: generation runs on the rollout's pool while the actor trains.

`fl.buffer(batch, max_staleness=k, stream=True)` with the streamed role (rollout.generate) alone on a pool
(split placement; anything else is one line: flowrl.runtime.offpolicy.buffering.refuse_stream); each rank of that pool is
one replica, and a pool of several spreads the groups over them (flowrl.runtime.offpolicy.spread_runner). The driver runs
the local executor's Streamer (flowrl.runtime.offpolicy.streaming: the draws, the scoring of each group as it arrives, the
take of the `batch_size` earliest drawn ready groups, the per-sample staleness drop, the consumers) over a
`RemoteRunner`: the StreamRunner (flowrl.runtime.offpolicy.stream_runner: the StreamingEngine and its asyncio loop) lives in
the rollout worker's process (`PoolWorker.stream`), and each of the driver's calls is one remote call (a take
waits there, up to roles.rollout.stream_timeout_s, for the groups it needs: no ray.get per sample).

Step t differs from the local executor's in one place: the engine is not paused while the consumers run (it
samples with its own copy of the weights, on its own pool), so samples keep finishing during the update
(`stream/done_while_training` counts the groups that did). After the consumers the engine pauses
(`pause(abort=roles.rollout.partial)`: in-flight samples finish under version t, or stop and keep their prefix);
step t+1 then streams the weights of version t+1 from the train pool (the executor's weight sync, the
transport of split pools) into the paused engine and resumes it at t+1. Between steps the engine is paused, so
evaluation and checkpoints find the rollout pool quiet.
"""

from __future__ import annotations

from typing import Any, Callable

import ray
from ray.exceptions import GetTimeoutError
from tensordict import TensorDict

from flowrl.errors import PlanError
from flowrl.graph.trace import Node
from flowrl.plan.planner import Plan
from flowrl.roles.rollout import Rollout
from flowrl.runtime.offpolicy import buffering, streaming
from flowrl.runtime.offpolicy.spread_runner import SpreadRunner
from flowrl.runtime.offpolicy.stream_runner import Group

START_TIMEOUT_S = 600.0  # the first call makes the streaming engine in the worker (a vLLM engine may load)
MARGIN_S = 30.0  # beyond the worker's own deadline, for the call's transfer


def make(plan: Plan, nodes: list[Node], workers_of: Callable[[str], list[Any]],
         versions: Callable[[], dict[str, int]]) -> streaming.Streamer | None:
    """The Ray executor's streamer for `plan` (None unless its buffer streams); what cannot stream is one
    PlanError line."""
    s = buffering.split(plan, nodes)
    if s is None or not s.stream:
        return None
    buffering.refuse_stream(plan, s)
    first = streaming.check(plan, s)
    if getattr(plan.specs[first.role].cls, first.method) is not Rollout.generate:
        raise PlanError(f"{plan.algorithm}: fl.buffer(stream=True) streams rollout.generate, which must be the "
                        f"first node before it; got {first.name}")
    workers = workers_of(first.role)
    if len(workers) == 1:
        return streaming.Streamer(s, lambda: RemoteRunner(workers[0], first.role), first, versions, overlap=True)
    return streaming.Streamer(s, lambda: SpreadRunner([RemoteRunner(w, first.role) for w in workers]), first,
                              versions, overlap=True)


class RemoteRunner:
    """A StreamRunner in `worker`'s process, for role `role`: the same methods, each one remote call."""

    def __init__(self, worker: Any, role: str):
        self.worker, self.role = worker, role
        self.timeout_s = START_TIMEOUT_S

    def settings(self) -> tuple[bool, float, int]:
        partial, self.timeout_s, pad_id = self._call("settings")
        return partial, self.timeout_s, pad_id

    def submit(self, batch: TensorDict, draw: int, n: int, sampling: dict[str, Any],
               rows: list[int] | None = None) -> None:
        self._call("submit", batch, draw, n, sampling, rows)

    def finished(self, wanted: int, timeout_s: float) -> tuple[list[Group], int]:
        return self._call("finished", wanted, timeout_s)

    def pause(self, abort: bool) -> int:
        return self._call("pause", abort)

    def resume(self, version: int) -> None:
        self._call("resume", version)

    def close(self) -> None:
        self._call("close")

    def _call(self, op: str, *args: Any) -> Any:
        """The worker's StreamRunner.<op>(*args), within its own deadline (roles.rollout.stream_timeout_s) and
        MARGIN_S."""
        try:
            return ray.get(self.worker.stream.remote(self.role, op, *args), timeout=self.timeout_s + MARGIN_S)
        except GetTimeoutError:
            raise TimeoutError(f"stream: the rollout worker did not answer {op} within "
                               f"roles.rollout.stream_timeout_s={self.timeout_s}s (+{MARGIN_S:g}s)") from None
