"""Node contracts at run time: a node touches only the fields it declared.

Tracing trusts each node's declared reads and writes; these checks make the
declarations true when the node runs, so a misspelled field fails at the
first step with the node and the field named instead of training silently.

- A stage runs on a batch holding only its declared reads: reading anything
  else fails. A row-changing stage also gets a row index (`ROW_INDEX`) that
  rides along as it drops, repeats or reorders rows; the executor then applies
  the same row change to every other field.
- Any node (stage or role method) that leaves a field it did not declare as
  a write, or does not write one it declared, fails.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import torch
from tensordict import TensorDict

from flowrl.errors import GraphError
from flowrl.graph.trace import Node, NodeKind

ROW_INDEX = "_row_index"
_MISSING_KEY = re.compile(r'key "([^"]+)" not found')


def run_stage(node: Node, batch: TensorDict) -> TensorDict:
    """Run a stage node under its contract; returns the whole batch with the node's effect applied."""
    assert node.fn is not None and node.kind in (NodeKind.MAP, NodeKind.ROWS), node
    view = batch.select(*sorted(node.reads & set(batch.keys())))
    if node.kind is NodeKind.ROWS:
        view[ROW_INDEX] = torch.arange(batch.batch_size[0])
    before = _snapshot(view)
    out = _call(node, lambda: node.fn(view, **node.kwargs))
    _check_writes(node, before, out)
    if node.kind is NodeKind.ROWS:
        if ROW_INDEX not in out.keys():
            raise GraphError(f"stage {node.name} returned a new batch without the rows' index; drop or "
                             f"reorder rows by indexing the batch it was given")
        batch = batch[out[ROW_INDEX]]
    for key in sorted(node.writes):
        batch.set(key, out.get(key), inplace=False)
    return batch


def call_checked(node: Node, fn: Callable[[TensorDict], TensorDict], batch: TensorDict) -> TensorDict:
    """fn(batch) for a role-method node, failing if it leaves an undeclared field or misses a declared one."""
    before = _snapshot(batch)
    out = _call(node, lambda: fn(batch))
    if node.kind is not NodeKind.SYNC:
        _check_writes(node, before, out)
    return out


def _call(node: Node, run: Callable[[], Any]) -> TensorDict:
    try:
        out = run()
    except KeyError as err:
        found = _MISSING_KEY.search(str(err.args[0]) if err.args else "")
        if found is None or found.group(1) in node.reads:
            raise
        raise GraphError(f"{_what(node)} reads {found.group(1)!r}, which it does not declare; its reads are "
                         f"{sorted(node.reads)}") from None
    if not isinstance(out, TensorDict):
        raise GraphError(f"{_what(node)} returned {type(out).__name__}; return the batch")
    return out


def _snapshot(batch: TensorDict) -> TensorDict:
    return batch.select(*batch.keys())  # a new table of the same tensors: later sets do not show here


def _check_writes(node: Node, before: TensorDict, out: TensorDict) -> None:
    had = set(before.keys())
    for key in sorted(set(out.keys()) - {ROW_INDEX}):
        changed = key not in had or (isinstance(out.get(key), torch.Tensor) and out.get(key) is not before.get(key)
                                     and node.kind is NodeKind.MAP)
        if changed and key not in node.writes:
            raise GraphError(f"{_what(node)} writes {key!r}, which it does not declare; its writes are "
                             f"{sorted(node.writes)}")
    missing = sorted(node.writes - set(out.keys()))
    if missing:
        raise GraphError(f"{_what(node)} declares it writes {missing[0]!r} but did not write it")


def _what(node: Node) -> str:
    return f"stage {node.name}" if node.role is None else f"{node.name}"
