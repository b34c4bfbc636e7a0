"""Executors run a compiled plan one step at a time; the local one runs it in this process.

`Executor` is the base of both: the step (stream, pipeline or plain nodes, the
first step's heap freeze), the public `run_nodes` each implements, and one
`VersionBook` of policy versions made from the plan (a view for another plan
shares it). `flowrl.runtime.ray.executor.RayExecutor` is the other one, with
each pool's roles in Ray actors. Both run nodes in an order the plan's edges allow.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, Iterator

from tensordict import TensorDict

from flowrl import metrics
from flowrl.engines.protocols import TrainEngine
from flowrl.errors import PlanError
from flowrl.graph.context import StepCalls
from flowrl.graph.role import close_role
from flowrl.graph.trace import Node
from flowrl.plan.planner import Plan
from flowrl.runtime.offpolicy import buffering, streaming
from flowrl.runtime.observe import gc_heap
from flowrl.runtime.scheduling import Spread, call_node, fill_index, run_step, scheduled


class VersionBook:
    """The one book of policy versions, made from the plan: updates run per versioned role (a node whose method
    updates weights counts one), and the source version each following role on another pool last loaded."""

    def __init__(self, plan: Plan):
        self.updates: dict[str, int] = {role: 0 for role in plan.versioned()}
        self.synced: dict[str, int] = {}

    def counted(self, node: Node, plan: Plan) -> None:
        """Count `node` if its method updates its role's weights."""
        if node.role in plan.specs and plan.specs[node.role].methods()[node.method].updates_weights:
            self.updates[node.role] = self.updates.get(node.role, 0) + 1


class Executor(ABC):
    """What the trainer needs from an executor, and the step both run: through the plan's stream, else its
    pipeline, else its plain nodes (fill included), each through `run_nodes`. After the first step with
    `gc_freeze` set, `freeze_heap()` once: that step made what lives as long as the run (compiles;
    flowrl.runtime.observe.gc_heap). `flowrl.runtime.ray.executor.RayExecutor` is the other one, with each pool's roles
    in Ray actors."""

    def __init__(self, plan: Plan, nodes: list[Node], spread: Spread, gc_freeze: bool, book: VersionBook | None):
        self.plan, self.nodes, self.fill_at, self.spread = plan, nodes, fill_index(nodes), spread
        self.gc_freeze, self.book = gc_freeze, book if book is not None else VersionBook(plan)
        self.stream: streaming.Streamer | None = None
        self.pipeline: buffering.Pipeline | None = None

    def run_step(self, step: int, prompts: Iterator[TensorDict]) -> tuple[TensorDict, dict[str, float]]:
        """One training step over prompt batches drawn from `prompts`; returns the batch and metrics."""
        if self.stream is not None:
            out = self.stream.step(step, prompts, self.run_nodes)
        elif self.pipeline is not None:
            out = self.pipeline.step(step, prompts, self.run_nodes)
        else:
            out = run_step(step, self.nodes, self.fill_at, self.run_nodes, prompts, self.spread)
        if self.gc_freeze:
            self.gc_freeze = False
            self.freeze_heap()
        return out

    @abstractmethod
    def run_nodes(self, nodes: list[Node], batch: TensorDict, calls: StepCalls) -> TensorDict:
        """Run `nodes` (in an order the plan's edges allow) on `batch` as calls of one step; an empty batch
        before the last node ends the run early."""

    @abstractmethod
    def freeze_heap(self) -> None:
        """Freeze the heaps of the processes running the roles (after the first step, with gc_freeze)."""

    @abstractmethod
    def for_plan(self, plan: Plan) -> "Executor":
        """Runs another plan (e.g. the evaluation) over the same roles, with the same version book."""

    @property
    def versions(self) -> dict[str, int]:
        """Update counts of the roles whose weights change (saved in checkpoints; set on resume, which makes
        the roles that follow them sync)."""
        return {role: self.book.updates.get(role, 0) for role in self.plan.versioned()}

    @versions.setter
    def versions(self, versions: dict[str, int]) -> None:
        for role in self.plan.versioned():
            self.book.updates[role] = versions.get(role, 0)
        self.set_role_versions({role: self.book.updates[role] for role in self.plan.versioned()})

    @abstractmethod
    def set_role_versions(self, versions: dict[str, int]) -> None:
        """Tell the roles (wherever they run) their versions, as the book has them after a resume."""

    @abstractmethod
    def train_engines(self) -> dict[str, TrainEngine]:
        """What a checkpoint saves and loads (save/load of the trainable roles, and of the buffered batches
        under flowrl.runtime.offpolicy.buffering.BUFFER when the plan buffers)."""

    @abstractmethod
    def save_pretrained(self, role: str, path: str, tokenizer: Any = None) -> None:
        """Exports the role's model as a Hugging Face folder."""

    @abstractmethod
    def close(self) -> None: ...


class LocalExecutor(Executor):
    """`gc_freeze`: after its first step, freeze the process's heap (flowrl.runtime.observe.gc_heap; thawed at close if
    nothing was frozen before)."""

    def __init__(self, plan: Plan, roles: dict[str, Any], world_size: int = 1, gc_freeze: bool = False,
                 book: VersionBook | None = None):
        missing = [r for r in plan.roles if r not in roles]
        if missing:
            raise PlanError(f"executor: role {missing[0]!r} of plan {plan.algorithm} has no instance")
        for role, pool in plan.pools.items():
            if pool.world_size != world_size:
                raise PlanError(f"placement: pool {pool.name!r} has world_size {pool.world_size}, but the local "
                                f"executor runs {world_size} rank(s); launch with torchrun or fix the pool")
        # torchrun: each rank holds its own rows; a fill gathers them and deals them out again evenly
        super().__init__(plan, scheduled(plan), Spread(ranks=world_size, collective=world_size > 1), gc_freeze, book)
        self.roles, self.world_size, self.closed = roles, world_size, False
        self.thaw, self.gc = False, gc_heap.CLOCK.install()
        self.stream = streaming.make(plan, self.nodes, roles, lambda: self.versions, world_size)
        self.pipeline = None if self.stream else buffering.make(plan, self.nodes, lambda: self.versions,
                                                                overlap=False, spread=self.spread)

    def freeze_heap(self) -> None:
        self.thaw = gc_heap.freeze_heap()  # this process's; the executor thaws it at close if it froze first

    def for_plan(self, plan: Plan) -> "LocalExecutor":
        return LocalExecutor(plan, self.roles, self.world_size, book=self.book)

    def train_engines(self) -> dict[str, TrainEngine]:
        return buffering.checkpointed({name: self.roles[name].engine for name in self.plan.trainable()},
                                      self.pipeline or self.stream)

    def set_role_versions(self, versions: dict[str, int]) -> None:
        for name, version in versions.items():
            self.roles[name].version = version

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

    def run_nodes(self, nodes: list[Node], batch: TensorDict, calls: StepCalls) -> TensorDict:
        for node in nodes:
            start, collected = time.perf_counter(), self.gc.seconds
            batch = call_node(node, self.roles, batch, calls)
            self.book.counted(node, self.plan)
            metrics.log(f"timing_s/{node.name}", time.perf_counter() - start)
            metrics.log(f"timing_s/gc/{node.name}", self.gc.seconds - collected)
            if batch.batch_size[0] == 0 and node is not nodes[-1]:
                return batch
        return batch
