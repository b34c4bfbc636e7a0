"""The planner: compile an algorithm's graph onto resource pools.

compile_plan traces the algorithm with the classes of the roles the run
gives, applies the rewrites roles declare (flowrl.plan.rewrites) and places
every node: a role's nodes on its pool, stages and driver roles on the driver.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any

import networkx as nx
from pydantic import BaseModel

import flowrl.roles  # noqa: F401 (registers the built-in roles the plans name)
from flowrl.errors import PlanError
from flowrl.graph import render
from flowrl.graph.algorithm import Algorithm
from flowrl.graph.role import RoleSpec, role_spec
from flowrl.graph.trace import SOURCE, Node, NodeKind, nodes_in_order
from flowrl.plan.placement import DRIVER, Placement, Pool
from flowrl.plan.rewrites import DEFER_KWARG, fold_deferred, insert_weight_syncs


@dataclass(frozen=True)
class Plan:
    algorithm: str
    graph: nx.DiGraph
    nodes: list[Node]  # in trace order, a topological order of `graph`
    pools: dict[str, Pool]  # role -> pool, for the placed roles the graph uses
    roles: tuple[str, ...]  # roles the graph uses
    specs: dict[str, RoleSpec]  # role -> its registration (with the class bound to it for this run)

    def shares_weights(self, role: str) -> bool:
        """The role and its weight source on one pool of one rank: it generates with the source's own module."""
        source = self.specs[role].weights_from
        mine, theirs = self.pools.get(role), self.pools.get(source)
        return theirs is not None and mine is theirs and mine.world_size == 1

    def shared(self) -> frozenset[str]:
        return frozenset(role for role in self.roles if self.specs[role].weights_from and self.shares_weights(role))

    def weight_links(self) -> list[tuple[str, str]]:
        """(follower, source) for every role that follows another role of the graph."""
        return [(r, s.weights_from) for r, s in self.specs.items() if s.weights_from in self.specs]

    def trainable(self) -> tuple[str, ...]:
        return tuple(r for r in self.roles if self.specs[r].trainable)

    def versioned(self) -> tuple[str, ...]:
        """Roles with a method that updates their weights: they keep a `version` count."""
        return tuple(r for r in self.roles if any(m.updates_weights for m in self.specs[r].methods().values()))

    def exported(self) -> tuple[str, ...]:
        return tuple(r for r in self.roles if self.specs[r].exported)

    def driver_roles(self) -> tuple[str, ...]:
        return tuple(r for r in self.roles if r not in self.pools)

    def mermaid(self) -> str:
        return render.mermaid(self.graph, [n.name for n in self.nodes], f"plan {self.algorithm}")

    def dot(self) -> str:
        return render.dot(self.graph, [n.name for n in self.nodes], f"plan {self.algorithm}")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return render.mimebundle(self.graph, [n.name for n in self.nodes], f"plan {self.algorithm}", self.describe())

    def describe(self) -> str:
        lines = [f"plan {self.algorithm}:"]
        for node in self.nodes:
            deps = sorted(p for p in self.graph.predecessors(node.name) if p != SOURCE)
            deferred = node.kwargs.get(DEFER_KWARG)
            note = f"  (with {node.role}.{deferred.method} deferred into it)" if deferred else ""
            lines.append(f"  {node.label():40s} <- {', '.join(deps) or SOURCE}{note}")
        return "\n".join(lines)


def compile_plan(algo: Algorithm, placement: Placement, input_fields: set[str],
                 role_classes: dict[str, type] | None = None, cfg: BaseModel | dict | None = None) -> Plan:
    """Trace, apply the role-declared rewrites, and place every node.

    role_classes binds role names to classes for this run (default: each role's registered class).
    """
    owner = placement.pool_of()
    specs = {r: role_spec(r, (role_classes or {}).get(r)) for r in algo.roles}
    given = {r: s.cls for r, s in specs.items() if r in owner or s.on_driver}
    graph, order = algo.trace(input_fields, given, cfg)
    used = tuple(r for r in algo.roles if any(graph.nodes[n]["node"].role == r for n in order))
    for role in owner:
        if role not in used:
            warnings.warn(f"placement: role {role!r} is placed but {algo.name} does not use it", stacklevel=2)
    specs = {r: specs[r] for r in used}
    order = insert_weight_syncs(graph, order, specs)
    fills = [n for n in order if graph.nodes[n]["node"].kind is NodeKind.FILL]
    if len(fills) > 1:
        raise PlanError(f"{algo.name}: at most one fill node per step, got {fills}")
    buffers = [n for n in order if graph.nodes[n]["node"].kind is NodeKind.BUFFER]
    if len(buffers) > 1:
        raise PlanError(f"{algo.name}: at most one buffer node per step, got {buffers}")
    if buffers and fills and order.index(fills[0]) > order.index(buffers[0]):
        raise PlanError(f"{algo.name}: {fills[0]} comes after {buffers[0]}; fill re-runs the nodes before it, so "
                        f"put it before the buffer (with the producers)")
    order = fold_deferred(graph, order, specs)
    nodes = []
    for node in nodes_in_order(graph, order):
        pool = owner[node.role].name if node.role in owner else DRIVER
        placed = replace(node, pool=pool)
        graph.nodes[node.name]["node"] = placed
        nodes.append(placed)
    return Plan(algorithm=algo.name, graph=graph, nodes=nodes, pools={r: owner[r] for r in used if r in owner},
                roles=used, specs=specs)


def model_roles(algo: Algorithm, input_fields: set[str], role_classes: dict[str, type] | None = None,
                cfg: BaseModel | dict | None = None) -> tuple[str, ...]:
    """The roles the traced graph uses that need a pool (for a default placement)."""
    specs = {r: role_spec(r, (role_classes or {}).get(r)) for r in algo.roles}
    graph, order = algo.trace(input_fields, {r: s.cls for r, s in specs.items()}, cfg)
    used = {graph.nodes[n]["node"].role for n in order}
    return tuple(r for r in algo.roles if r in used and not specs[r].on_driver)
