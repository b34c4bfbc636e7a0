"""Prebuilt algorithms, each a small graph over shared stages and losses."""

from flowrl.algorithms.cispo import CISPOConfig, cispo
from flowrl.algorithms.dapo import DAPOConfig, dapo
from flowrl.algorithms.dppo import DPPOConfig, dppo
from flowrl.algorithms.grpo import GRPOConfig, grpo
from flowrl.algorithms.grpo_async import GRPOAsyncConfig, grpo_async
from flowrl.algorithms.gspo import GSPOConfig, gspo
from flowrl.algorithms.ppo import PPOConfig, ppo
from flowrl.algorithms.reinforce_pp import ReinforcePPConfig, reinforce_pp
from flowrl.algorithms.remax import ReMaxConfig, remax
from flowrl.algorithms.rloo import RLOOConfig, rloo

REGISTRY = {"ppo": ppo, "grpo": grpo, "dapo": dapo, "rloo": rloo, "reinforce_pp": reinforce_pp, "remax": remax,
            "gspo": gspo, "cispo": cispo, "dppo": dppo,
            "grpo_async": grpo_async}

__all__ = ["REGISTRY", "ppo", "grpo", "dapo", "rloo", "reinforce_pp", "remax", "gspo", "cispo", "dppo",
           "grpo_async",
           "PPOConfig", "GRPOConfig", "DAPOConfig", "RLOOConfig", "ReinforcePPConfig", "ReMaxConfig", "GSPOConfig",
           "CISPOConfig", "DPPOConfig",
           "GRPOAsyncConfig"]
