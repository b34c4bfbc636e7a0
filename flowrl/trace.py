"""Tracing: run an algorithm function over symbolic batches and role handles.

Every role-method call and stage call on a `SymBatch` appends a `Node` to a
networkx DiGraph; edges run from the node that last wrote a field to each node
that reads it, so independent nodes (ref and old logprobs) can run in
parallel. A read of a field no earlier node writes fails here, before any
model loads.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import networkx as nx

from flowrl.errors import GraphError

SOURCE = "input"

Fields = tuple[str, ...] | Callable[..., tuple[str, ...]]


@dataclass(frozen=True)
class Spec:
    """What a node reads and writes; either may depend on the call's kwargs."""

    reads: Fields = ()
    writes: Fields = ()
    kind: str = "map"  # "map" (rows kept), "rows" (rows change), "fill", "sync"
    check: Callable[..., None] | None = None  # validates the call's kwargs at trace time

    def resolve(self, kwargs: dict[str, Any]) -> tuple[frozenset[str], frozenset[str]]:
        reads = self.reads(**kwargs) if callable(self.reads) else self.reads
        writes = self.writes(**kwargs) if callable(self.writes) else self.writes
        return frozenset(reads), frozenset(writes)


@dataclass(frozen=True)
class Node:
    name: str
    kind: str
    reads: frozenset[str]
    writes: frozenset[str]
    kwargs: dict[str, Any] = field(default_factory=dict)
    role: str | None = None
    method: str | None = None
    fn: Callable | None = None
    pool: str | None = None

    def label(self) -> str:
        return self.name if self.pool is None else f"{self.name} @{self.pool}"


class Tracer:
    """Holds the graph being built and the field -> producing node map."""

    def __init__(self, input_fields: frozenset[str]):
        self.graph = nx.DiGraph()
        self.graph.add_node(SOURCE, node=None)
        self.producers = {f: SOURCE for f in input_fields}
        self.latest: SymBatch = SymBatch(self, frozenset(input_fields))
        self.order: list[str] = []

    def record(self, batch: "SymBatch", base: str, spec: Spec, kwargs: dict[str, Any],
               **node_attrs: Any) -> "SymBatch":
        if batch is not self.latest:
            raise GraphError(f"{base}: called on a stale batch; pass the batch returned by the previous node")
        reads, writes = spec.resolve(kwargs)
        missing = sorted(reads - batch.fields)
        if missing:
            raise GraphError(f"{base} reads {missing[0]!r}, which no earlier node writes; "
                             f"available fields: {sorted(batch.fields)}")
        name = self._unique(base)
        node = Node(name=name, kind=spec.kind, reads=reads, writes=writes, kwargs=dict(kwargs), **node_attrs)
        self.graph.add_node(name, node=node)
        for f in sorted(reads):
            self.graph.add_edge(self.producers[f], name)
        if spec.kind != "map" and self.order:
            self.graph.add_edge(self.order[-1], name)  # row changes order after everything before
        # a node that changes rows (or syncs) rewrites every row of every field: later readers depend on it
        for f in (batch.fields | writes) if spec.kind != "map" else writes:
            self.producers[f] = name
        self.order.append(name)
        self.latest = SymBatch(self, batch.fields | writes)
        return self.latest

    def _unique(self, base: str) -> str:
        name, i = base, 2
        while name in self.graph:
            name, i = f"{base}#{i}", i + 1
        return name


class SymBatch:
    """A batch during tracing: only the set of fields it holds."""

    def __init__(self, tracer: Tracer, fields: frozenset[str]):
        self.tracer = tracer
        self.fields = fields

    def __repr__(self) -> str:
        return f"SymBatch({sorted(self.fields)})"

    def __getitem__(self, key: str) -> Any:
        raise GraphError(f"batch[{key!r}] read inside an algorithm; do tensor work in a @flowrl.stage")


class RoleHandle:
    """Stands in for a role during tracing; attribute access yields its graph methods."""

    def __init__(self, name: str, cls: type):
        self._name, self._cls = name, cls

    def __getattr__(self, method: str) -> Callable[..., SymBatch]:
        spec = getattr(getattr(self._cls, method, None), "__flowrl_spec__", None)
        if spec is None:
            have = sorted(m for m in dir(self._cls) if getattr(getattr(self._cls, m), "__flowrl_spec__", None))
            raise GraphError(f"role {self._name!r} has no graph method {method!r}; it has {have}")

        def call(batch: SymBatch, **kwargs: Any) -> SymBatch:
            if not isinstance(batch, SymBatch):
                raise GraphError(f"{self._name}.{method} got {type(batch).__name__}, expected the traced batch")
            check_call(f"{self._name}.{method}", getattr(self._cls, method), None, batch, **kwargs)
            if spec.check is not None:
                spec.check(**kwargs)
            return batch.tracer.record(batch, f"{self._name}.{method}", spec, kwargs,
                                       role=self._name, method=method)

        return call


def check_call(name: str, fn: Callable, *args: Any, **kwargs: Any) -> None:
    """A GraphError at trace time for arguments the function would reject when it runs."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as err:
        raise GraphError(f"{name}: {err}") from None


def graph_method(reads: Fields = (), writes: Fields = (), kind: str = "map",
                 check: Callable[..., None] | None = None) -> Callable:
    """Mark a role method as a graph node with the fields it reads and writes."""

    def mark(fn: Callable) -> Callable:
        fn.__flowrl_spec__ = Spec(reads=reads, writes=writes, kind=kind, check=check)
        return fn

    return mark


def nodes_in_order(graph: nx.DiGraph, order: list[str]) -> list[Node]:
    return [graph.nodes[name]["node"] for name in order]
