"""Errors raised for user mistakes in graphs, plans and configs."""


class GraphError(ValueError):
    """An algorithm graph is malformed: a field nobody writes, a role not given, a stale batch."""


class PlanError(ValueError):
    """A placement cannot host the graph: a role placed twice or not at all, a bad pool."""
