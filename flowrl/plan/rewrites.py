"""Plan rewrites, each driven by what roles declare (flowrl.graph.role), never by their names.

- Weight syncs: a role that follows another's weights (`weights_from`) gets
  its sync method inserted before its first node of each step, when both roles
  are in the graph.
- Deferral: a node whose method declares `defer_to=M`, and whose writes only
  one call of M on the same role reads, is folded into that call: the node
  leaves the plan and the M node gets it as `deferred=Deferred(method,
  kwargs)`, reads the folded call's inputs instead of its writes, and makes
  them itself (old logprobs: a single-step update takes them from its own
  forward pass; otherwise it computes them first). The plan shows it; no
  role keeps state between the two calls.
"""

from __future__ import annotations

import networkx as nx

from flowrl.graph.role import RoleSpec
from dataclasses import replace

from flowrl.graph.trace import SOURCE, Deferred, Node, NodeKind

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


def fold_deferred(graph: nx.DiGraph, order: list[str], specs: dict[str, RoleSpec]) -> list[str]:
    """Fold each deferrable node into its one reader (see the module's doc); the order without them."""
    for name in [n for n in order if n != SOURCE]:
        node = graph.nodes[name]["node"]
        if node.role not in specs or node.kind is not NodeKind.MAP:
            continue
        target = specs[node.role].methods()[node.method].defer_to
        readers = [graph.nodes[n]["node"] for n in order if n != SOURCE and graph.nodes[n]["node"].reads & node.writes]
        if target is None or len(readers) != 1 or (readers[0].role, readers[0].method) != (node.role, target):
            continue
        reader = readers[0]
        folded = replace(reader, reads=(reader.reads - node.writes) | node.reads,
                         kwargs={**reader.kwargs, DEFER_KWARG: Deferred(node.method, dict(node.kwargs))})
        for before in list(graph.predecessors(name)):
            graph.add_edge(before, reader.name)
        graph.remove_node(name)
        graph.nodes[reader.name]["node"] = folded
        order = [n for n in order if n != name]
    return order
