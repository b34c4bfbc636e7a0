"""The planner: compile an algorithm's graph onto resource pools.

A pool is a set of workers (a world of ranks on one device type) hosting one
or more roles. Roles in one pool are colocated: they share the workers and, for
actor + rollout at world size 1, the very same module (the hybrid engine moves
no weights). Roles in different pools each hold their own copy, and the
planner inserts a weight sync before the first generation of every step.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Literal

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from flowrl.algorithm import ROLE_NAMES, Algorithm
from flowrl.errors import PlanError
from flowrl.trace import SOURCE, Node, nodes_in_order

DRIVER = "driver"
MODEL_ROLES = ("actor", "rollout", "ref", "critic")


class Pool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="Pool name, unique in the placement.")
    roles: list[str] = Field(description="Roles hosted by this pool's workers.")
    world_size: int = Field(1, ge=1, description="Workers (ranks) in the pool.")
    device: Literal["cpu", "cuda"] = Field("cpu", description="Device type of the pool's workers.")

    @field_validator("roles")
    @classmethod
    def _known_roles(cls, roles: list[str]) -> list[str]:
        for role in roles:
            if role not in ROLE_NAMES:
                raise ValueError(f"unknown role {role!r}; roles are {ROLE_NAMES}")
        return roles


class Placement(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pools: list[Pool] = Field(description="Resource pools; a role absent from every pool runs on the driver "
                                          "(allowed for the reward role only).")

    @classmethod
    def colocated(cls, roles: tuple[str, ...] = MODEL_ROLES, world_size: int = 1, device: str = "cpu") -> "Placement":
        """Every model role on one pool: the hybrid-engine default."""
        return cls(pools=[Pool(name="global", roles=list(roles), world_size=world_size, device=device)])

    def pool_of(self) -> dict[str, Pool]:
        owner: dict[str, Pool] = {}
        names: set[str] = set()
        for pool in self.pools:
            if pool.name in names or pool.name == DRIVER:
                raise PlanError(f"placement.pools: pool name {pool.name!r} is used twice or reserved")
            names.add(pool.name)
            for role in pool.roles:
                if role in owner:
                    raise PlanError(f"placement: role {role!r} is in pools {owner[role].name!r} and {pool.name!r}")
                owner[role] = pool
        return owner


@dataclass(frozen=True)
class Plan:
    algorithm: str
    graph: nx.DiGraph
    nodes: list[Node]
    pools: dict[str, Pool]  # role -> pool, for the roles the graph uses
    roles: tuple[str, ...]  # roles the graph uses

    def shares_actor_module(self) -> bool:
        """Actor and rollout on one pool of one rank: generation runs on the training module."""
        actor, rollout = self.pools.get("actor"), self.pools.get("rollout")
        return actor is not None and actor is rollout and actor.world_size == 1

    def describe(self) -> str:
        lines = [f"plan {self.algorithm}:"]
        for node in self.nodes:
            deps = sorted(p for p in self.graph.predecessors(node.name) if p != SOURCE)
            note = "  (deferred to actor.update when it is one step)" if node.kwargs.get("on_policy") else ""
            lines.append(f"  {node.label():40s} <- {', '.join(deps) or SOURCE}{note}")
        return "\n".join(lines)


def compile_plan(algo: Algorithm, placement: Placement, input_fields: set[str], role_classes: dict[str, type],
                 cfg: BaseModel | dict | None = None) -> Plan:
    """Trace, insert the weight sync, and place every node on a pool."""
    owner = placement.pool_of()
    given = {r: cls for r, cls in role_classes.items() if r in owner or r not in MODEL_ROLES}
    graph, order = algo.trace(input_fields, given, cfg)
    used = tuple(r for r in ROLE_NAMES if any(graph.nodes[n]["node"].role == r for n in order))
    for role in owner:
        if role not in used:
            warnings.warn(f"placement: role {role!r} is placed but {algo.name} does not use it", stacklevel=2)
    if "actor" in used and "rollout" in used:
        order = _insert_sync(graph, order)
    fills = [n for n in order if graph.nodes[n]["node"].kind == "fill"]
    if len(fills) > 1:
        raise PlanError(f"{algo.name}: at most one fill node per step, got {fills}")
    on_policy = _old_logprobs_only_for_update(nodes_in_order(graph, order))
    nodes = []
    for node in nodes_in_order(graph, order):
        pool = owner[node.role].name if node.role in owner else DRIVER
        kwargs = {**node.kwargs, "on_policy": True} if node.name in on_policy else node.kwargs
        placed = replace(node, pool=pool, kwargs=kwargs)
        graph.nodes[node.name]["node"] = placed
        nodes.append(placed)
    return Plan(algorithm=algo.name, graph=graph, nodes=nodes, pools={r: owner[r] for r in used if r in owner},
                roles=used)


def _old_logprobs_only_for_update(nodes: list[Node]) -> set[str]:
    """actor.logprobs nodes whose output only actor.update reads: they may defer to the update."""
    readers = [n for n in nodes if "old_logprobs" in n.reads]
    if not readers or any((n.role, n.method) != ("actor", "update") for n in readers):
        return set()
    return {n.name for n in nodes if (n.role, n.method) == ("actor", "logprobs")}


def _insert_sync(graph: nx.DiGraph, order: list[str]) -> list[str]:
    generates = [n for n in order if graph.nodes[n]["node"].method == "generate"]
    if not generates:
        return order
    sync = Node(name="rollout.sync_weights", kind="sync", reads=frozenset(), writes=frozenset(),
                role="rollout", method="sync_weights")
    graph.add_node(sync.name, node=sync)
    graph.add_edge(SOURCE, sync.name)
    graph.add_edge(sync.name, generates[0])
    at = order.index(generates[0])
    return order[:at] + [sync.name] + order[at:]
