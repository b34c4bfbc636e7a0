"""Prebuilt algorithms, each a small graph over shared stages and losses."""

from flowrl.algorithms.dapo import DAPOConfig, dapo
from flowrl.algorithms.grpo import GRPOConfig, grpo
from flowrl.algorithms.ppo import PPOConfig, ppo
from flowrl.algorithms.rloo import RLOOConfig, rloo

REGISTRY = {"ppo": ppo, "grpo": grpo, "dapo": dapo, "rloo": rloo}

__all__ = ["REGISTRY", "ppo", "grpo", "dapo", "rloo", "PPOConfig", "GRPOConfig", "DAPOConfig", "RLOOConfig"]
