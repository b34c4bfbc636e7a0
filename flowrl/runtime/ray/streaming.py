"""Streamed rollouts on the Ray executor: generation runs on the rollout's pool while the actor trains.

`fl.buffer(batch, max_staleness=k, stream=True)` with the streamed role (rollout.generate) alone on a pool
(split placement; anything else is one line: flowrl.runtime.offpolicy.buffering.refuse_stream); each rank of that pool is
one replica, or with roles.rollout.tensor_parallel_size k each k consecutive ranks are (the leader and its
followers, flowrl.engines.streaming.lockstep), and several replicas share the groups
(flowrl.runtime.offpolicy.spread_runner). The driver runs
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
from flowrl.engines.weights.reshard_plan import check_layout
from flowrl.runtime.offpolicy.spread_runner import ReplicaRunner, SpreadRunner
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
    replicas = replica_workers(workers_of(first.role), first.role)
    runners = [lambda ws=ws: replica_runner(ws, first.role) for ws in replicas]
    if len(runners) == 1:
        return streaming.Streamer(s, runners[0], first, versions, overlap=True)
    return streaming.Streamer(s, lambda: SpreadRunner([make() for make in runners]), first, versions, overlap=True)


def replica_workers(workers: list[Any], role: str) -> list[list[Any]]:
    """The pool's ranks as replicas: consecutive groups of the role's tensor_parallel_size k (its engine's
    `tp_ranks`; the ranks its replica group joined, flowrl.engines.streaming.lockstep.replica_group); a pool
    that k does not divide is one line (flowrl.engines.weights.reshard_plan.check_layout)."""
    k = ray.get(workers[0].tensor_ranks.remote(role), timeout=START_TIMEOUT_S)
    try:
        count = check_layout(len(workers), k)
    except ValueError as err:
        raise PlanError(str(err)) from None
    return [workers[r * k:(r + 1) * k] for r in range(count)]


def replica_runner(workers: list[Any], role: str) -> "RemoteRunner | ReplicaRunner":
    """One replica's runner: its one rank's, or (tensor parallel) its leader's with its followers'."""
    runners = [RemoteRunner(w, role) for w in workers]
    return runners[0] if len(runners) == 1 else ReplicaRunner(runners[0], runners[1:])


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
