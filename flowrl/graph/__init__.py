"""The graph layer: algorithms traced into dataflow graphs over roles and stages."""

from flowrl.graph.algorithm import Algorithm, NoConfig, algorithm
from flowrl.graph.registry import Registry
from flowrl.graph.role import ROLES, RoleSpec, graph_method, role, role_spec
from flowrl.graph.role_config import RoleConfig
from flowrl.graph.stage import Stage, buffer, fill, stage
from flowrl.graph.trace import SOURCE, Deferred, Node, NodeKind, Spec

__all__ = ["Algorithm", "NoConfig", "algorithm", "Registry", "ROLES", "RoleConfig", "RoleSpec", "graph_method",
           "role", "role_spec", "Stage", "buffer", "fill", "stage", "SOURCE", "Deferred", "Node", "NodeKind", "Spec"]
