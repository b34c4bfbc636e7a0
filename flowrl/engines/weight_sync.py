"""Weight syncs: how the actor's weights reach the rollout engine after an update.

- SharedModuleSync: one process, and the rollout engine holds the very module
  the train engine updates, so there is nothing to move.
- FullStateSync: the rollout model is a separate copy (on each rank, or in
  another process): gather the full state dict (a collective when the train
  model is FSDP2-sharded, so every rank must call it) and load it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from flowrl.engines.protocols import RolloutEngine, TrainEngine, WeightSync


class SharedModuleSync:
    """Nothing to move: train and rollout engines hold the same nn.Module."""

    def __call__(self, train: Any, rollout: Any) -> None:
        assert train.model is rollout.model, "SharedModuleSync needs one module shared by both engines"


class FullStateSync:
    """Loads train.full_state_dict() into the rollout engine (collective when sharded)."""

    def __call__(self, train: TrainEngine, rollout: RolloutEngine) -> None:
        rollout.load_weights(train.full_state_dict())


def choose_weight_sync(train_model: torch.nn.Module | None, rollout_model: torch.nn.Module) -> WeightSync:
    """SharedModuleSync when both engines hold one module, else FullStateSync.

    A shared module cannot be FSDP2-sharded: generate() stops after a
    different number of steps on each rank, and the sharded forward's
    collectives would hang. So sharing with world size > 1 is a ValueError.
    """
    if train_model is not rollout_model:
        return FullStateSync()
    world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world_size > 1:
        raise ValueError(f"rollout_model is the train model itself with world size {world_size}; give the "
                         "rollout engine its own unsharded copy and use FullStateSync")
    return SharedModuleSync()
