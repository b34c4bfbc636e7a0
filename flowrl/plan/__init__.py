"""The plan layer: placement of roles on resource pools, and the compiled plan."""

from flowrl.plan.placement import DRIVER, Placement, Pool
from flowrl.plan.planner import Plan, compile_plan, model_roles

__all__ = ["DRIVER", "Placement", "Pool", "Plan", "compile_plan", "model_roles"]
