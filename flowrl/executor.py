"""The local executor: runs a compiled plan in this process, one step at a time.

Nodes run in trace order (a topological order of the graph). A fill node
splits the step: the nodes before it are re-run on fresh prompts until enough
groups survive, then the rest runs once on the filled batch.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

from tensordict import TensorDict

from flowrl import metrics
from flowrl.batch import concat, first_groups, num_groups
from flowrl.errors import PlanError
from flowrl.planner import Plan
from flowrl.trace import Node


class LocalExecutor:
    def __init__(self, plan: Plan, roles: dict[str, Any], world_size: int = 1):
        missing = [r for r in plan.roles if r not in roles]
        if missing:
            raise PlanError(f"executor: role {missing[0]!r} of plan {plan.algorithm} has no instance")
        for role, pool in plan.pools.items():
            if pool.world_size != world_size:
                raise PlanError(f"placement: pool {pool.name!r} has world_size {pool.world_size}, but the local "
                                f"executor runs {world_size} rank(s); launch with torchrun or fix the pool")
        self.plan, self.roles = plan, roles
        fills = [i for i, n in enumerate(plan.nodes) if n.kind == "fill"]
        self.fill_at = fills[0] if fills else None
        if self.fill_at is not None and world_size > 1:
            raise PlanError(f"{plan.algorithm}: dynamic sampling (fill) leaves ranks with unequal rows, which "
                            f"FSDP cannot step together; run it with world_size 1")

    def run_step(self, step: int, prompts: Iterator[TensorDict]) -> tuple[TensorDict, dict[str, float]]:
        """One training step over prompt batches drawn from `prompts`; returns the batch and metrics."""
        if "rollout" in self.roles:
            self.roles["rollout"].begin_step(step)
        with metrics.collect() as logged:
            start = time.perf_counter()
            batch = next(prompts)
            if self.fill_at is None:
                batch = self._run(self.plan.nodes, batch)
            else:
                batch = self._fill(batch, prompts)
                if batch.batch_size[0] == 0:
                    metrics.log("sampling/skipped_step", 1.0)
                else:
                    batch = self._run(self.plan.nodes[self.fill_at + 1:], batch)
            metrics.log("timing_s/step", time.perf_counter() - start)
        return batch, logged

    def _fill(self, batch: TensorDict, prompts: Iterator[TensorDict]) -> TensorDict:
        node = self.plan.nodes[self.fill_at]
        target = node.kwargs.get("num_groups") or batch.batch_size[0]
        max_rounds = node.kwargs.get("max_rounds", 4)
        if max_rounds < 1:
            raise ValueError(f"fill: max_rounds must be >= 1, got {max_rounds}")
        kept: list[TensorDict] = []
        for round_ in range(max_rounds):
            if round_:
                batch = next(prompts)
            kept.append(self._run(self.plan.nodes[:self.fill_at], batch))
            if sum(num_groups(b) for b in kept) >= target:
                break
        filled = concat(kept)
        metrics.log("sampling/rounds", round_ + 1)
        metrics.log("sampling/groups", min(num_groups(filled), target))
        return first_groups(filled, target) if filled.batch_size[0] else filled

    def _run(self, nodes: list[Node], batch: TensorDict) -> TensorDict:
        for node in nodes:
            start = time.perf_counter()
            batch = self._call(node, batch)
            metrics.log(f"timing_s/{node.name}", time.perf_counter() - start)
            if batch.batch_size[0] == 0 and node is not nodes[-1]:
                return batch
        return batch

    def _call(self, node: Node, batch: TensorDict) -> TensorDict:
        if node.kind == "fill":
            return batch
        if node.role is not None:
            return getattr(self.roles[node.role], node.method)(batch, **node.kwargs)
        return node.fn(batch, **node.kwargs)
