"""Executors run a compiled plan one step at a time; the local one runs it in this process.

`Executor` is what the trainer needs from an executor;
`flowrl.runtime.ray_executor.RayExecutor` is the other one, with each pool's
roles in Ray actors. Both run nodes in an order the plan's edges allow.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Protocol

from tensordict import TensorDict

from flowrl import metrics
from flowrl.engines.protocols import TrainEngine
from flowrl.errors import PlanError
from flowrl.graph.context import StepCalls
from flowrl.graph.role import close_role
from flowrl.graph.trace import Node
from flowrl.plan.planner import Plan
from flowrl.runtime import buffering, gc_heap, streaming
from flowrl.runtime.scheduling import Spread, call_node, executor_step, fill_index, scheduled


class Executor(Protocol):
    plan: Plan

    def run_step(self, step: int, prompts: Iterator[TensorDict]) -> tuple[TensorDict, dict[str, float]]: ...

    def for_plan(self, plan: Plan) -> "Executor":
        """Runs another plan (e.g. the evaluation) over the same roles."""
        ...

    @property
    def versions(self) -> dict[str, int]:
        """Update counts of the roles whose weights change (saved in checkpoints; set on resume, which makes
        the roles that follow them sync)."""
        ...

    @versions.setter
    def versions(self, versions: dict[str, int]) -> None: ...

    def train_engines(self) -> dict[str, TrainEngine]:
        """What a checkpoint saves and loads (save/load of the trainable roles, and of the buffered batches
        under flowrl.runtime.buffering.BUFFER when the plan buffers)."""
        ...

    def save_pretrained(self, role: str, path: str, tokenizer: Any = None) -> None:
        """Exports the role's model as a Hugging Face folder."""
        ...

    def close(self) -> None: ...


class LocalExecutor:
    """`gc_freeze`: after its first step, freeze the process's heap (flowrl.runtime.gc_heap; thawed at close if
    nothing was frozen before)."""

    def __init__(self, plan: Plan, roles: dict[str, Any], world_size: int = 1, gc_freeze: bool = False):
        missing = [r for r in plan.roles if r not in roles]
        if missing:
            raise PlanError(f"executor: role {missing[0]!r} of plan {plan.algorithm} has no instance")
        for role, pool in plan.pools.items():
            if pool.world_size != world_size:
                raise PlanError(f"placement: pool {pool.name!r} has world_size {pool.world_size}, but the local "
                                f"executor runs {world_size} rank(s); launch with torchrun or fix the pool")
        self.plan, self.roles, self.world_size, self.closed = plan, roles, world_size, False
        self.gc_freeze, self.thaw, self.gc = gc_freeze, False, gc_heap.CLOCK.install()
        self.nodes = scheduled(plan)
        self.fill_at = fill_index(self.nodes)
        # torchrun: each rank holds its own rows; a fill gathers them and deals them out again evenly
        self.spread = Spread(ranks=world_size, collective=world_size > 1)
        self.stream = streaming.make(plan, self.nodes, roles, lambda: self.versions, world_size)
        self.pipeline = None if self.stream else buffering.make(plan, self.nodes, lambda: self.versions,
                                                                overlap=False, spread=self.spread)

    def run_step(self, step: int, prompts: Iterator[TensorDict]) -> tuple[TensorDict, dict[str, float]]:
        """One training step over prompt batches drawn from `prompts`; returns the batch and metrics."""
        return executor_step(self, step, prompts, self._freeze_heap)

    def _freeze_heap(self) -> None:
        self.thaw = gc_heap.freeze_heap()  # this process's; the executor thaws it at close if it froze first

    def for_plan(self, plan: Plan) -> "LocalExecutor":
        return LocalExecutor(plan, self.roles, self.world_size)

    def train_engines(self) -> dict[str, TrainEngine]:
        return buffering.checkpointed({name: self.roles[name].engine for name in self.plan.trainable()},
                                      self.pipeline or self.stream)

    @property
    def versions(self) -> dict[str, int]:
        return {name: self.roles[name].version for name in self.plan.versioned()}

    @versions.setter
    def versions(self, versions: dict[str, int]) -> None:
        for name in self.plan.versioned():
            self.roles[name].version = versions.get(name, 0)

    def save_pretrained(self, role: str, path: str, tokenizer: Any = None) -> None:
        self.roles[role].engine.save_pretrained(path, tokenizer)

    def close(self) -> None:
        """Closes the roles in this process (each role class's optional `close()`); again, does nothing."""
        if not self.closed:
            self.closed = True
            if self.stream is not None:
                self.stream.close()
            for instance in self.roles.values():
                close_role(instance)
            if self.thaw:
                gc_heap.thaw_heap()

    def _run(self, nodes: list[Node], batch: TensorDict, calls: StepCalls) -> TensorDict:
        for node in nodes:
            start, collected = time.perf_counter(), self.gc.seconds
            batch = call_node(node, self.roles, batch, calls)
            metrics.log(f"timing_s/{node.name}", time.perf_counter() - start)
            metrics.log(f"timing_s/gc/{node.name}", self.gc.seconds - collected)
            if batch.batch_size[0] == 0 and node is not nodes[-1]:
                return batch
        return batch
