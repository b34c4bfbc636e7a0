"""flowrl: RL post-training of LLMs as small dataflow graphs over model roles."""

from flowrl.algorithm import Algorithm, algorithm
from flowrl.errors import GraphError, PlanError
from flowrl.executor import LocalExecutor
from flowrl.planner import Placement, Plan, Pool, compile_plan
from flowrl.stage import Stage, fill, stage

__all__ = ["Algorithm", "algorithm", "stage", "Stage", "fill", "GraphError", "PlanError", "LocalExecutor",
           "Placement", "Plan", "Pool", "compile_plan"]
__version__ = "0.1.0"
