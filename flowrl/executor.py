"""Executors run a compiled plan one step at a time; the local one runs it in this process.

Nodes run in trace order (a topological order of the graph). A fill node
splits the step: the nodes before it are re-run on fresh prompts until enough
groups survive, then the rest runs once on the filled batch. `Executor` is
what the trainer needs from an executor; `flowrl.ray_executor.RayExecutor` is
the other one, with each pool's roles in Ray actors.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Protocol

from tensordict import TensorDict

from flowrl import metrics
from flowrl.batch import concat, first_groups, num_groups
from flowrl.engines.protocols import TrainEngine
from flowrl.errors import PlanError
from flowrl.planner import Plan
from flowrl.trace import Node

TRAINABLE_ROLES = ("actor", "critic")  # the roles whose state a checkpoint holds
RunNodes = Callable[[list[Node], TensorDict], TensorDict]


class Executor(Protocol):
    plan: Plan
    actor_version: int  # the actor's update count, saved in checkpoints; set on resume to force a weight sync

    def run_step(self, step: int, prompts: Iterator[TensorDict]) -> tuple[TensorDict, dict[str, float]]: ...

    def for_plan(self, plan: Plan) -> "Executor":
        """Runs another plan (e.g. the evaluation) over the same roles."""
        ...

    def train_engines(self) -> dict[str, TrainEngine]:
        """What a checkpoint saves and loads (save/load of the trainable roles)."""
        ...

    def save_pretrained(self, path: str, tokenizer: Any = None) -> None:
        """Exports the actor as a Hugging Face folder."""
        ...

    def close(self) -> None: ...


class LocalExecutor:
    def __init__(self, plan: Plan, roles: dict[str, Any], world_size: int = 1):
        missing = [r for r in plan.roles if r not in roles]
        if missing:
            raise PlanError(f"executor: role {missing[0]!r} of plan {plan.algorithm} has no instance")
        for role, pool in plan.pools.items():
            if pool.world_size != world_size:
                raise PlanError(f"placement: pool {pool.name!r} has world_size {pool.world_size}, but the local "
                                f"executor runs {world_size} rank(s); launch with torchrun or fix the pool")
        self.plan, self.roles, self.world_size = plan, roles, world_size
        self.fill_at = fill_index(plan)
        if self.fill_at is not None and world_size > 1:
            raise PlanError(f"{plan.algorithm}: dynamic sampling (fill) leaves ranks with unequal rows, which "
                            f"FSDP cannot step together; run it with world_size 1")

    def run_step(self, step: int, prompts: Iterator[TensorDict]) -> tuple[TensorDict, dict[str, float]]:
        """One training step over prompt batches drawn from `prompts`; returns the batch and metrics."""
        if "rollout" in self.roles:
            self.roles["rollout"].begin_step(step)
        with metrics.collect() as logged:
            start = time.perf_counter()
            batch = run_with_fill(self.plan.nodes, self.fill_at, self._run, prompts)
            metrics.log("timing_s/step", time.perf_counter() - start)
        return batch, logged

    def for_plan(self, plan: Plan) -> "LocalExecutor":
        return LocalExecutor(plan, self.roles, self.world_size)

    def train_engines(self) -> dict[str, TrainEngine]:
        return {name: self.roles[name].engine for name in TRAINABLE_ROLES if name in self.roles}

    @property
    def actor_version(self) -> int:
        return self.roles["actor"].version if "actor" in self.roles else 0

    @actor_version.setter
    def actor_version(self, version: int) -> None:
        self.roles["actor"].version = version

    def save_pretrained(self, path: str, tokenizer: Any = None) -> None:
        self.roles["actor"].engine.save_pretrained(path, tokenizer)

    def close(self) -> None:
        """Nothing to release: the roles live in this process."""

    def _run(self, nodes: list[Node], batch: TensorDict) -> TensorDict:
        for node in nodes:
            start = time.perf_counter()
            batch = call_node(node, self.roles, batch)
            metrics.log(f"timing_s/{node.name}", time.perf_counter() - start)
            if batch.batch_size[0] == 0 and node is not nodes[-1]:
                return batch
        return batch

def call_node(node: Node, roles: dict[str, Any], batch: TensorDict) -> TensorDict:
    """Run one node in this process: a role method on `roles`, or a stage (a fill node is a no-op here)."""
    if node.kind == "fill":
        return batch
    if node.role is not None:
        return getattr(roles[node.role], node.method)(batch, **node.kwargs)
    return node.fn(batch, **node.kwargs)


def fill_index(plan: Plan) -> int | None:
    fills = [i for i, n in enumerate(plan.nodes) if n.kind == "fill"]
    return fills[0] if fills else None


def run_with_fill(nodes: list[Node], fill_at: int | None, run: RunNodes, prompts: Iterator[TensorDict]) -> TensorDict:
    """A step's nodes over the next prompts; with a fill node, the nodes before it until enough groups survive."""
    batch = next(prompts)
    if fill_at is None:
        return run(nodes, batch)
    batch = _fill(nodes, fill_at, run, batch, prompts)
    if batch.batch_size[0] == 0:
        metrics.log("sampling/skipped_step", 1.0)
        return batch
    return run(nodes[fill_at + 1:], batch)


def _fill(nodes: list[Node], fill_at: int, run: RunNodes, batch: TensorDict,
          prompts: Iterator[TensorDict]) -> TensorDict:
    node = nodes[fill_at]
    target = node.kwargs.get("num_groups") or batch.batch_size[0]
    max_rounds = node.kwargs.get("max_rounds", 4)
    if max_rounds < 1:
        raise ValueError(f"fill: max_rounds must be >= 1, got {max_rounds}")
    kept: list[TensorDict] = []
    for round_ in range(max_rounds):
        if round_:
            batch = next(prompts)
        kept.append(run(nodes[:fill_at], batch))
        if sum(num_groups(b) for b in kept) >= target:
            break
    filled = concat(kept)
    metrics.log("sampling/rounds", round_ + 1)
    metrics.log("sampling/groups", min(num_groups(filled), target))
    return first_groups(filled, target) if filled.batch_size[0] else filled
