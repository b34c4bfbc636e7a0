"""Engines: model backends behind the protocols roles depend on, each chosen by name from a registry.

Importing this package does not import transformers: the HF engines are
registered lazily (flowrl.engines.configs) and load on first use.
"""

from flowrl.engines.configs import (ROLLOUT_ENGINES, TRAIN_ENGINES, ModelSource, RolloutEngineConfig,
                                    TrainEngineConfig)
from flowrl.engines.protocols import (FinishReason, LossFn, RewardFn, RolloutEngine, SamplingParams, TrainEngine,
                                      WeightSync)

__all__ = ["ROLLOUT_ENGINES", "TRAIN_ENGINES", "ModelSource", "RolloutEngineConfig", "TrainEngineConfig",
           "FinishReason", "LossFn", "RewardFn", "RolloutEngine", "SamplingParams", "TrainEngine", "WeightSync"]
