"""A plan node across a pool's ranks, for the Ray executor (flowrl.runtime.ray.executor).

- `checked_nodes`: the plan's nodes in schedule order and how a fill deals out its rows.
- `split_rows` deals a node's rows evenly over its pool's ranks; `merge_outputs` puts their results back into the batch.
- `Launched` is a node in flight (its result and metrics refs, one per rank).
- `NodeTimeout` and `WorkerDied` are the errors a node ends with; `remote_cause` is a Ray task's own message.
- `freeze_heaps`: the workers freeze their heaps after the first step (executor.gc_freeze).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayTaskError
from tensordict import TensorDict

from flowrl.data.batch import concat
from flowrl.graph.trace import Node, NodeKind
from flowrl.plan.planner import Plan
from flowrl.runtime.scheduling import Spread, fill_index, scheduled


@dataclass
class Launched:
    node: Node
    batches: list[ray.ObjectRef]  # one per rank (for a cross-pool sync: the load_weights calls)
    logged: list[ray.ObjectRef]  # one metrics dict per rank
    start: float


def remote_cause(err: BaseException) -> str:
    """The message of the exception a Ray task raised (without Ray's remote traceback)."""
    cause = err.cause if isinstance(err, RayTaskError) else err
    return " ".join(str(cause).split())[:500]


class NodeTimeout(RuntimeError):
    """A node ran past executor.node_timeout_s (the message names it, its pool and the ranks still running)."""


class WorkerDied(RuntimeError):
    """A Ray worker process ended while running a node."""


FREEZE_TIMEOUT_S = 120.0  # one collection and gc.freeze() in each worker, queued behind its running call


def freeze_heaps(workers: list[Any]) -> None:
    """Each worker's heap frozen (flowrl.runtime.observe.gc_heap; the workers end with the executor: nothing thaws)."""
    try:
        ray.get([w.freeze_heap.remote() for w in workers], timeout=FREEZE_TIMEOUT_S)
    except GetTimeoutError:
        raise NodeTimeout(f"executor.gc_freeze: the workers did not freeze their heaps within {FREEZE_TIMEOUT_S:g} s "
                          f"of the first step's end; rerun to resume, or set executor.gc_freeze=false") from None


def merge_outputs(node: Node, outs: list[Any], batch: TensorDict) -> TensorDict:
    if node.kind is NodeKind.ROWS:
        return concat(outs)
    if node.kind is NodeKind.MAP and node.writes:
        written = concat(outs)
        for key in sorted(node.writes):
            batch[key] = written[key]
    return batch


def split_rows(batch: TensorDict, node: Node, num_ranks: int) -> list[TensorDict]:
    rows = batch.batch_size[0]
    if rows % num_ranks:
        raise ValueError(f"pool {node.pool!r}: {node.name} got {rows} rows, which do not split evenly over its "
                         f"world_size {num_ranks}; make train.batch_size (and eval.prompts) a multiple of it")
    size = rows // num_ranks
    return [batch[rank * size:(rank + 1) * size] for rank in range(num_ranks)]


def checked_nodes(plan: Plan) -> tuple[list[Node], int | None, Spread]:
    """The plan's nodes in schedule order, its fill node's index, and how a fill deals out its rows: the driver
    holds them all, and keeps a number of groups every pool after the fill splits evenly."""
    nodes = scheduled(plan)
    fill_at = fill_index(nodes)
    after = nodes[fill_at + 1:] if fill_at is not None else []
    ranks = math.lcm(1, *(plan.pools[n.role].world_size for n in after if n.role in plan.pools))
    return nodes, fill_at, Spread(ranks=ranks)
