"""flowrl: RL post-training of LLMs as small dataflow graphs over model roles.

Layers, lowest first (imports only go down): errors and metrics; data
(batches, tasks); graph (tracing, roles, stages); engines (model backends);
rl (ops, losses, stages); roles (the built-in roles); plan (placement and
planner); config; runtime (executors, trainer); cli.
"""

from flowrl import metrics
from flowrl import roles as _builtin_roles  # noqa: F401  (registers the built-in roles)
from flowrl.errors import GraphError, PlanError
from flowrl.graph import Algorithm, Stage, algorithm, fill, graph_method, role, stage
from flowrl.plan import Placement, Plan, Pool, compile_plan
from flowrl.rl import losses, stages
from flowrl.runtime.executor import LocalExecutor

__all__ = ["metrics", "Algorithm", "algorithm", "stage", "Stage", "fill", "role", "graph_method", "GraphError", "PlanError",
           "LocalExecutor", "Placement", "Plan", "Pool", "compile_plan", "losses", "stages"]
__version__ = "0.1.0"
