"""flowrl: RL post-training of LLMs as small dataflow graphs over model roles.

Layers, lowest first (imports only go down): errors and metrics; data
(batches, tasks); graph (tracing, roles, stages); engines (model backends);
rl (ops, losses, stages); roles (the built-in roles); plan (placement and
planner); config; runtime (executors, trainer); cli.

The public names below load on first use, so `flowrl --help` and
`import flowrl.config` do not import torch models they do not need.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "Algorithm": "flowrl.graph", "algorithm": "flowrl.graph", "stage": "flowrl.graph", "Stage": "flowrl.graph",
    "fill": "flowrl.graph", "buffer": "flowrl.graph", "role": "flowrl.graph", "graph_method": "flowrl.graph",
    "RoleConfig": "flowrl.graph",
    "GraphError": "flowrl.errors", "PlanError": "flowrl.errors", "LocalExecutor": "flowrl.runtime.executor",
    "Placement": "flowrl.plan", "Plan": "flowrl.plan", "Pool": "flowrl.plan", "compile_plan": "flowrl.plan",
    "connect": "flowrl.runtime.ray.cluster", "train": "flowrl.runtime.trainer", "load_run_config": "flowrl.config",
    # what a user algorithm needs (docs/concepts.md, "The user's surface")
    "GRPOConfig": "flowrl.rl.algorithm_configs", "PPOConfig": "flowrl.rl.algorithm_configs",
    "ActorCriticConfig": "flowrl.rl.algorithm_configs", "critic_free_step": "flowrl.rl.subgraphs",
    "ppo_step": "flowrl.rl.subgraphs", "Loss": "flowrl.rl.loss_terms", "PolicyTerm": "flowrl.rl.loss_terms",
    "KLTerm": "flowrl.rl.loss_terms", "EntropyTerm": "flowrl.rl.loss_terms", "ValueTerm": "flowrl.rl.loss_terms",
    "policy_loss": "flowrl.rl.loss_terms", "value_loss": "flowrl.rl.loss_terms", "LossPreset": "flowrl.rl.losses",
    "Sampled": "flowrl.rl.options", "GroupSampling": "flowrl.rl.options", "KLLoss": "flowrl.rl.options",
    "GRPOKL": "flowrl.rl.options", "KLReward": "flowrl.rl.options", "AdaptiveKLReward": "flowrl.rl.options",
    "RolloutCorrectionConfig": "flowrl.rl.correction",
}
_MODULES = {"losses": "flowrl.rl.losses", "stages": "flowrl.rl.stages", "metrics": "flowrl.metrics",
            "roles": "flowrl.roles"}

__all__ = ["metrics", "losses", "stages", *_PUBLIC]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        if _PUBLIC[name] == "flowrl.graph":  # an algorithm may name any built-in role: register them first
            importlib.import_module("flowrl.roles")
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    else:
        raise AttributeError(f"module 'flowrl' has no attribute {name!r}")
    globals()[name] = value
    return value
