"""Engines: model backends behind the protocols roles depend on."""

from flowrl.engines.hf_rollout import HFRolloutEngine, mask_after_eos
from flowrl.engines.hf_train import HFTrainEngine
from flowrl.engines.protocols import (LossFn, RewardFn, RolloutEngine, SamplingParams, TrainEngine,
                                      WeightSync)
from flowrl.engines.weight_sync import FullStateSync, SharedModuleSync, choose_weight_sync

__all__ = [
    "FullStateSync", "HFRolloutEngine", "HFTrainEngine", "LossFn", "RewardFn", "RolloutEngine",
    "SamplingParams", "SharedModuleSync", "TrainEngine", "WeightSync", "choose_weight_sync", "mask_after_eos",
]
