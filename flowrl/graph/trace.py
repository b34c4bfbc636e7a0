"""Tracing: run an algorithm function over symbolic batches and role handles.

Every role-method call and stage call on a `SymBatch` appends a `Node` to a
networkx DiGraph. The edges are the whole schedule: an edge runs to a node from
the node that last wrote each field it reads, from every node that read a
field since it was last written when this node overwrites it, and from the
last writer of a field it writes again. A node that changes rows (or fills,
syncs or buffers) is a barrier: it follows every node since the previous barrier and
every later node follows it. So independent nodes (ref and old logprobs) have
no path between them, and executors may run them at once. A read of a field
no earlier node writes fails here, before any model loads.
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import networkx as nx

from flowrl.errors import GraphError, MissingField

SOURCE = "input"

Fields = tuple[str, ...] | Callable[..., tuple[str, ...]]


class NodeKind(str, enum.Enum):
    MAP = "map"  # rows kept; writes the declared fields
    ROWS = "rows"  # rows dropped, repeated or reordered
    FILL = "fill"  # dynamic sampling: re-run the nodes before it until enough groups survive
    SYNC = "sync"  # moves weights between roles; reads and writes no field
    BUFFER = "buffer"  # bounded staleness: the nodes before it may run up to `max_staleness` steps ahead

    @property
    def barrier(self) -> bool:
        return self is not NodeKind.MAP


@dataclass(frozen=True)
class Spec:
    """What a node reads and writes (either may depend on the call's kwargs), and what plans may do with it."""

    reads: Fields = ()
    writes: Fields = ()
    kind: NodeKind = NodeKind.MAP
    check: Callable[..., None] | None = None  # validates the call's kwargs at trace time
    defer_to: str | None = None  # a method of the same role that may compute this node's writes itself (Deferred)
    updates_weights: bool = False  # the role's weights change: roles that follow them need a sync
    rows_per_input: str | None = None  # the keyword argument that says how many rows each input row becomes

    def resolve(self, kwargs: dict[str, Any]) -> tuple[frozenset[str], frozenset[str]]:
        reads = self.reads(**kwargs) if callable(self.reads) else self.reads
        writes = self.writes(**kwargs) if callable(self.writes) else self.writes
        return frozenset(reads), frozenset(writes)


@dataclass(frozen=True)
class Deferred:
    """A call the planner folded into the one later node that reads its writes, a method of the same role (its
    Spec.defer_to): that method gets it as its `deferred` argument and makes the call's writes itself when it
    needs them, or skips the call where its own pass gives them (old logprobs inside a single-step update)."""

    method: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Node:
    name: str
    kind: NodeKind
    reads: frozenset[str]
    writes: frozenset[str]
    kwargs: dict[str, Any] = field(default_factory=dict)
    role: str | None = None
    method: str | None = None
    fn: Callable | None = None
    pool: str | None = None
    rows_per_input: str | None = None  # its Spec's

    def row_multiplier(self) -> int:
        """How many rows each input row becomes (1 unless the method declares a keyword that says it)."""
        return self.kwargs.get(self.rows_per_input, 1) if self.rows_per_input else 1

    def other_kwargs(self) -> dict[str, Any]:
        """The call's keyword arguments but the row multiplier's."""
        return {k: v for k, v in self.kwargs.items() if k != self.rows_per_input}

    def label(self) -> str:
        return self.name if self.pool is None else f"{self.name} @{self.pool}"


class Tracer:
    """Holds the graph being built, who last wrote each field and who read it since."""

    def __init__(self, input_fields: frozenset[str]):
        self.graph = nx.DiGraph()
        self.graph.add_node(SOURCE, node=None)
        self.producers = {f: SOURCE for f in input_fields}
        self.readers: dict[str, set[str]] = {}
        self.since_barrier: list[str] = []
        self.barrier: str | None = None
        self.latest: SymBatch = SymBatch(self, frozenset(input_fields))
        self.order: list[str] = []

    def record(self, batch: "SymBatch", base: str, spec: Spec, kwargs: dict[str, Any],
               **node_attrs: Any) -> "SymBatch":
        if batch is not self.latest:
            raise GraphError(f"{base}: called on a stale batch; pass the batch returned by the previous node")
        reads, writes = spec.resolve(kwargs)
        missing = sorted(reads - batch.fields)
        if missing:
            raise MissingField(f"{base} reads {missing[0]!r}, which no earlier node writes; "
                               f"available fields: {sorted(batch.fields)}", missing[0])
        name = self._unique(base)
        node = Node(name=name, kind=spec.kind, reads=reads, writes=writes, kwargs=dict(kwargs),
                    rows_per_input=spec.rows_per_input, **node_attrs)
        self.graph.add_node(name, node=node)
        self._add_edges(name, node, batch.fields)
        self.order.append(name)
        self.latest = SymBatch(self, batch.fields | writes)
        return self.latest

    def _add_edges(self, name: str, node: Node, fields: frozenset[str]) -> None:
        deps = {self.producers[f] for f in node.reads}  # read after write
        for f in node.writes:  # write after read, write after write
            deps |= self.readers.get(f, set()) | ({self.producers[f]} if f in self.producers else set())
        if node.kind.barrier:
            deps |= set(self.since_barrier)
        if self.barrier is not None:
            deps.add(self.barrier)
        for dep in sorted(deps - {name}) or [SOURCE]:
            self.graph.add_edge(dep, name)
        for f in node.reads:
            self.readers.setdefault(f, set()).add(name)
        # a node that changes rows (or syncs) rewrites every row of every field: later readers depend on it
        for f in (fields | node.writes) if node.kind.barrier else node.writes:
            self.producers[f] = name
            self.readers[f] = set()
        if node.kind.barrier:
            self.barrier, self.since_barrier = name, []
        else:
            self.since_barrier.append(name)

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
        raise GraphError(f"batch[{key!r}] read inside an algorithm; do tensor work in a @flowrl.graph.stage")


def check_call(name: str, fn: Callable, /, *args: Any, **kwargs: Any) -> None:
    """A GraphError at trace time for arguments the function would reject when it runs."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as err:
        raise GraphError(f"{name}: {err}") from None


def nodes_in_order(graph: nx.DiGraph, order: list[str]) -> list[Node]:
    return [graph.nodes[name]["node"] for name in order]
