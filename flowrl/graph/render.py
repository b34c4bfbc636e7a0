"""Pictures of a traced graph: Mermaid and Graphviz DOT source, and the Jupyter rendering of both.

`Algorithm` and `Plan` show as a Mermaid flowchart in Jupyter (through
`_repr_mimebundle_`), and `flowrl plan ALGO --format mermaid|dot` prints the
source. Role nodes are boxes labelled with their pool; stages are rounded;
row-changing, fill, sync and buffer nodes are marked.
"""

from __future__ import annotations

import networkx as nx

from flowrl.graph.trace import SOURCE, Node, NodeKind

_MERMAID_SHAPES = {NodeKind.MAP: ("[", "]"), NodeKind.ROWS: ("[/", "/]"), NodeKind.FILL: ("{{", "}}"),
                   NodeKind.SYNC: ("[(", ")]"), NodeKind.BUFFER: ("[[", "]]")}


def _ids(graph: nx.DiGraph, order: list[str]) -> dict[str, str]:
    return {SOURCE: "input", **{name: f"n{i}" for i, name in enumerate(order)}}


def _label(node: Node) -> str:
    text = node.label()
    return text if node.role is not None or node.kind in (NodeKind.FILL, NodeKind.BUFFER) else f"{text} (stage)"


def mermaid(graph: nx.DiGraph, order: list[str], title: str) -> str:
    """A Mermaid flowchart (top to bottom) of the graph's nodes in `order` and its edges."""
    ids = _ids(graph, order)
    lines = ["flowchart TB", f"  %% {title}", "  input([input batch])"]
    for name in order:
        node = graph.nodes[name]["node"]
        left, right = ("(", ")") if node.role is None and node.kind is NodeKind.MAP else _MERMAID_SHAPES[node.kind]
        lines.append(f'  {ids[name]}{left}"{_label(node)}"{right}')
    lines += [f"  {ids[a]} --> {ids[b]}" for a, b in graph.edges if a in ids and b in ids]
    return "\n".join(lines)


def dot(graph: nx.DiGraph, order: list[str], title: str) -> str:
    """Graphviz DOT source of the same picture."""
    ids = _ids(graph, order)
    lines = [f'digraph "{title}" {{', "  rankdir=TB;", '  input [label="input batch", shape=oval];']
    for name in order:
        node = graph.nodes[name]["node"]
        shape = "box" if node.role is not None else "box, style=rounded"
        if node.kind is not NodeKind.MAP:
            shape += ", peripheries=2"
        lines.append(f'  {ids[name]} [label="{_label(node)}", shape={shape}];')
    lines += [f"  {ids[a]} -> {ids[b]};" for a, b in graph.edges if a in ids and b in ids]
    return "\n".join([*lines, "}"])


def mimebundle(graph: nx.DiGraph, order: list[str], title: str, text: str) -> dict[str, str]:
    """What Jupyter shows: the Mermaid chart (rendered in JupyterLab's markdown), plain text elsewhere."""
    return {"text/markdown": f"```mermaid\n{mermaid(graph, order, title)}\n```", "text/plain": text}
