"""Every prebuilt algorithm's graph function stays small (the issue's bound: 25 lines)."""

import inspect

import pytest

from flowrl.algorithms import REGISTRY


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_graph_code_is_at_most_25_lines(name):
    source = inspect.getsource(REGISTRY[name].fn)
    lines = [line for line in source.splitlines() if line.strip() and not line.strip().startswith(("#", "@"))]
    assert len(lines) <= 25, f"{name}: {len(lines)} lines"
