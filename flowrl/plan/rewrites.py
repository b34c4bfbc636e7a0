"""Plan rewrites, each driven by what roles declare (flowrl.graph.role), never by their names.

- Weight syncs: a role that follows another's weights (`weights_from`) gets
  its sync method inserted before its first node of each step, when both roles
  are in the graph.
- Deferral: a node whose method declares `defer_to=M`, and whose writes only
  calls of M on the same role read, is marked `deferred=True`: M may compute
  those fields itself (old logprobs inside a single-step update).
"""

from __future__ import annotations

import networkx as nx

from flowrl.graph.role import RoleSpec
from flowrl.graph.trace import SOURCE, Node, NodeKind

DEFER_KWARG = "deferred"


def insert_weight_syncs(graph: nx.DiGraph, order: list[str], specs: dict[str, RoleSpec]) -> list[str]:
    """Insert `<role>.<sync method>` before the first node of each role whose weight source is in the graph."""
    for role, spec in specs.items():
        if spec.weights_from not in specs:
            continue
        method = spec.sync_method()
        firsts = [n for n in order if graph.nodes[n]["node"].role == role]
        if not firsts or graph.nodes[firsts[0]]["node"].method == method:
            continue
        sync = Node(name=f"{role}.{method}", kind=NodeKind.SYNC, reads=frozenset(), writes=frozenset(),
                    role=role, method=method)
        assert sync.name not in graph, sync.name
        graph.add_node(sync.name, node=sync)
        graph.add_edge(SOURCE, sync.name)
        graph.add_edge(sync.name, firsts[0])
        at = order.index(firsts[0])
        order = order[:at] + [sync.name] + order[at:]
    return order


def deferrable(nodes: list[Node], specs: dict[str, RoleSpec]) -> set[str]:
    """Nodes whose writes only their role's `defer_to` method reads: they may defer to it."""
    out = set()
    for node in nodes:
        if node.role is None or node.role not in specs:
            continue
        target = specs[node.role].methods()[node.method].defer_to
        readers = [n for n in nodes if n.reads & node.writes]
        if target is not None and readers and all((n.role, n.method) == (node.role, target) for n in readers):
            out.add(node.name)
    return out
