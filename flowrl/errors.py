"""Errors raised for user mistakes in graphs, plans and configs."""


class GraphError(ValueError):
    """An algorithm graph is malformed: a field nobody writes, a role not given, a stale batch."""


class PlanError(ValueError):
    """A placement cannot host the graph: a role placed twice or not at all, a bad pool."""


class MissingField(GraphError):
    """A node reads a field that neither an earlier node nor the data gives (`field` names it)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field
