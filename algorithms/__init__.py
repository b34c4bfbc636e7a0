"""Prebuilt algorithms, each a small graph over shared stages and losses."""

from flowrl.graph.algorithm import ALGORITHMS
from flowrl.algorithms.cispo import CISPOConfig, cispo
from flowrl.algorithms.dapo import DAPOConfig, dapo
from flowrl.algorithms.dppo import DPPOConfig, dppo
from flowrl.algorithms.grpo import GRPOConfig, grpo
from flowrl.algorithms.grpo_async import GRPOAsyncConfig, grpo_async
from flowrl.algorithms.grpo_multiturn import GRPOMultiTurnConfig, grpo_multiturn
from flowrl.algorithms.gspo import GSPOConfig, gspo
from flowrl.algorithms.ppo import PPOConfig, ppo
from flowrl.algorithms.reinforce_pp import ReinforcePPConfig, reinforce_pp
from flowrl.algorithms.remax import ReMaxConfig, remax
from flowrl.algorithms.rloo import RLOOConfig, rloo
from flowrl.algorithms.reinforce_pp_baseline import ReinforcePPBaselineConfig, reinforce_pp_baseline
from flowrl.algorithms.gpg import GPGConfig, gpg
from flowrl.algorithms.opo import OPOConfig, opo
from flowrl.algorithms.grpo_passk import GRPOPassKConfig, grpo_passk
from flowrl.algorithms.sapo import SAPOConfig, sapo
from flowrl.algorithms.gmpo import GMPOConfig, gmpo
from flowrl.algorithms.clip_cov import ClipCovConfig, clip_cov
from flowrl.algorithms.kl_cov import KLCovConfig, kl_cov
from flowrl.algorithms.pf_ppo import PFPPOConfig, pf_ppo
from flowrl.algorithms.otb import OTBConfig, otb
from flowrl.algorithms.sft import SFTConfig, sft
from flowrl.algorithms.rm import RMConfig, rm
from flowrl.algorithms.distill import DistillConfig, distill

REGISTRY = {"ppo": ppo, "grpo": grpo, "dapo": dapo, "rloo": rloo, "reinforce_pp": reinforce_pp, "remax": remax,
            "gspo": gspo, "cispo": cispo, "dppo": dppo, "grpo_multiturn": grpo_multiturn,
            "grpo_async": grpo_async,
            "reinforce_pp_baseline": reinforce_pp_baseline, "gpg": gpg, "opo": opo, "grpo_passk": grpo_passk,
            "sapo": sapo, "gmpo": gmpo, "clip_cov": clip_cov, "kl_cov": kl_cov, "pf_ppo": pf_ppo,
            "otb": otb, "sft": sft, "rm": rm, "distill": distill}

for _name, _algorithm in REGISTRY.items():  # the one list: `flowrl train NAME` finds them in ALGORITHMS
    ALGORITHMS.register(_name, _algorithm)

__all__ = ["REGISTRY", "ppo", "grpo", "dapo", "rloo", "reinforce_pp", "remax", "gspo", "cispo", "dppo",
           "grpo_multiturn",
           "grpo_async",
           "PPOConfig", "GRPOConfig", "DAPOConfig", "RLOOConfig", "ReinforcePPConfig", "ReMaxConfig", "GSPOConfig",
           "CISPOConfig", "DPPOConfig", "GRPOMultiTurnConfig",
           "GRPOAsyncConfig",
           "reinforce_pp_baseline", "gpg", "opo", "grpo_passk", "sapo", "gmpo", "clip_cov", "kl_cov", "pf_ppo", "otb",
           "ReinforcePPBaselineConfig", "GPGConfig", "OPOConfig", "GRPOPassKConfig", "SAPOConfig", "GMPOConfig",
           "ClipCovConfig", "KLCovConfig", "PFPPOConfig", "OTBConfig",
           "sft", "rm", "SFTConfig", "RMConfig", "distill", "DistillConfig"]
