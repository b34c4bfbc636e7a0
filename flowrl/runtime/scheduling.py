"""What both executors share: running one node in-process, the plan's schedule, dynamic sampling (fill), one
step's nodes with fill (`run_step`; the executors' base, flowrl.runtime.executor.Executor, runs it).

A fill node splits the step: the nodes before it are re-run on fresh prompts
until enough groups survive (counted over all ranks), then the rest runs once
on the filled batch. The filled batch is the same at any world size: the
surviving groups of every rank, in uid order, cut to the target and to a
multiple of the world size, then dealt out evenly (`Spread`); under torchrun
each rank keeps its share, on Ray the driver holds them and the nodes split them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import networkx as nx
import torch
from tensordict import TensorDict

from flowrl import metrics
from flowrl.data.batch import concat, first_groups, keep_rows, num_groups
from flowrl.graph.context import CallInfo, StepCalls, calling
from flowrl.graph.contracts import call_checked, run_stage
from flowrl.graph.trace import Node, NodeKind
from flowrl.plan.planner import Plan
from flowrl.runtime import distributed

RunNodes = Callable[[list[Node], TensorDict], TensorDict]


@dataclass(frozen=True)
class Spread:
    """How a step's rows lie over ranks, for dynamic sampling (fill).

    `ranks`: the nodes after the fill split its rows over this many ranks, so it keeps a multiple of it
    groups. `collective`: each rank draws and holds its own rows (torchrun), so the fill sums counts and
    gathers rows over torch.distributed and each rank keeps its share; otherwise (one process, the Ray
    driver) this process holds every row.
    """

    ranks: int = 1
    collective: bool = False

    def total(self, count: int) -> int:
        return distributed.sum_over_ranks(count) if self.collective else count

    def gather(self, batch: TensorDict, key: str) -> TensorDict:
        """Every rank's rows, ordered by their group field `key` (stable: a group's rows keep their order)."""
        batch = concat(distributed.gather_objects(batch)) if self.collective else batch
        if batch.batch_size[0] == 0:
            return batch
        return batch[torch.sort(batch[key], stable=True).indices]

    def mine(self, batch: TensorDict, key: str) -> TensorDict:
        """This rank's share of `batch` (groups in order, a multiple of `ranks` of them): a run of whole groups."""
        if not self.collective or batch.batch_size[0] == 0:
            return batch
        groups = torch.unique_consecutive(batch[key])
        size = groups.numel() // self.ranks
        rank = distributed.rank()
        return keep_rows(batch, torch.isin(batch[key], groups[rank * size:(rank + 1) * size]))


ONE = Spread()


def scheduled(plan: Plan) -> list[Node]:
    """The plan's nodes in an order its edges allow (ties broken by trace order, which is such an order)."""
    index = {node.name: i for i, node in enumerate(plan.nodes)}
    graph = plan.graph.subgraph(index)
    by_name = {node.name: node for node in plan.nodes}
    return [by_name[name] for name in nx.lexicographical_topological_sort(graph, key=index.__getitem__)]


def ready(plan: Plan, todo: list[Node], segment: set[str], done: set[str]) -> list[Node]:
    """Nodes of `todo` whose predecessors in `segment` (the nodes being run) are all done."""
    return [node for node in todo
            if all(p not in segment or p in done for p in plan.graph.predecessors(node.name))]


def call_role(node: Node, role: Any, batch: TensorDict, info: CallInfo) -> TensorDict:
    """role.<method>(batch, **kwargs) under its contract, as call `info` of the step."""
    method = getattr(role, node.method)
    with calling(info):
        return call_checked(node, lambda b: method(b, **node.kwargs), batch)


def call_node(node: Node, roles: dict[str, Any], batch: TensorDict, calls: StepCalls) -> TensorDict:
    """Run one node in this process: a role method on `roles`, or a stage (fill and buffer nodes are no-ops
    here: the step around them acts on them)."""
    if node.kind in (NodeKind.FILL, NodeKind.BUFFER):
        return batch
    with metrics.node(node.name), torch.profiler.record_function(node.name):  # a range in profiles' traces
        if node.role is None:
            return run_stage(node, batch)
        return call_role(node, roles[node.role], batch, calls.next(node.role, node.method))


def fill_index(nodes: list[Node]) -> int | None:
    fills = [i for i, n in enumerate(nodes) if n.kind is NodeKind.FILL]
    return fills[0] if fills else None


def run_step(step: int, nodes: list[Node], fill_at: int | None, run: Callable[[list[Node], TensorDict, StepCalls],
             TensorDict], prompts: Iterator[TensorDict], spread: Spread = ONE) -> tuple[TensorDict, dict[str, float]]:
    """One step of an executor: its nodes (`run(nodes, batch, calls)`) over the next prompts, with fill over
    `spread`, timed; returns the batch and the step's metrics."""
    calls = StepCalls(step)
    with metrics.collect() as logged:
        start = time.perf_counter()
        batch = run_with_fill(nodes, fill_at, lambda todo, b: run(todo, b, calls), prompts, spread)
        metrics.log("timing_s/step", time.perf_counter() - start)
    return batch, logged


def run_with_fill(nodes: list[Node], fill_at: int | None, run: RunNodes, prompts: Iterator[TensorDict],
                  spread: Spread = ONE) -> TensorDict:
    """A step's nodes over the next prompts; with a fill node, the nodes before it until enough groups survive."""
    batch = next(prompts)
    if fill_at is None:
        return run(nodes, batch)
    batch = _fill(nodes, fill_at, run, batch, prompts, spread)
    if batch.batch_size[0] == 0:
        metrics.log("sampling/skipped_step", 1.0)
        return batch
    return run(nodes[fill_at + 1:], batch)


def _fill(nodes: list[Node], fill_at: int, run: RunNodes, batch: TensorDict,
          prompts: Iterator[TensorDict], spread: Spread) -> TensorDict:
    """Rounds of the nodes before the fill until `num_groups` groups (default: the step's prompts, over all
    ranks) survive over all ranks, or `max_rounds`; the filled batch as `Spread` deals it out."""
    node = nodes[fill_at]
    (key,) = node.reads  # the group field
    target = node.kwargs.get("num_groups") or spread.total(batch.batch_size[0])
    max_rounds = node.kwargs.get("max_rounds", 4)
    if max_rounds < 1:
        raise ValueError(f"fill: max_rounds must be >= 1, got {max_rounds}")
    kept: list[TensorDict] = []
    for round_ in range(max_rounds):
        if round_:
            batch = next(prompts)
        kept.append(run(nodes[:fill_at], batch))
        if spread.total(sum(num_groups(b) for b in kept)) >= target:
            break
    filled = spread.gather(concat(kept), key)
    groups = min(num_groups(filled), target)
    groups -= groups % spread.ranks  # the nodes after split the groups evenly over the ranks
    metrics.log("sampling/rounds", round_ + 1)
    metrics.log("sampling/groups", groups)
    return spread.mine(first_groups(filled, groups), key) if filled.batch_size[0] else filled
