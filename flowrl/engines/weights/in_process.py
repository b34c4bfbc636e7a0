"""Weight syncs: how the actor's weights reach the rollout engine in the same process after an update.

- SharedModuleSync: the rollout engine holds the very module the train engine
  updates, so there is nothing to move.
- StreamedSync: the rollout model is a separate copy (each torchrun rank's
  unsharded rollout, or vLLM's): the train engine's entries, unsharded one at
  a time on its device (a collective when FSDP2-sharded, so every rank must
  call it), go straight into the rollout engine's `load_weight_stream`; no
  state dict is built, on the CPU or anywhere (sync.transport=in_process,
  flowrl.engines.weights.buckets).

- ReshardSync (flowrl.engines.weights.reshard_sync), what `choose_weight_sync` picks
  over several ranks: each rank receives only the rows of its rollout copy that
  other ranks hold (no full tensor gathered); StreamedSync where the train
  engine offers no shards (LoRA, unsharded).

Across processes (split Ray pools) the executor moves the weights over a
group of its own (flowrl.engines.weights.reshard_sync.ReshardTransport, or
flowrl.engines.weights.buckets.CollectiveTransport with sync.reshard=false).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from flowrl import metrics
from flowrl.engines.protocols import RolloutEngine, TrainEngine, WeightSync
from flowrl.engines.weights.reshard_sync import ReshardSync
from flowrl.engines.weights.buckets import SYNC_TIMEOUT_S, WeightSyncTimeout, first_line


class SharedModuleSync:
    """Nothing to move: train and rollout engines hold the same nn.Module."""

    def __call__(self, train: Any, rollout: Any) -> None:
        assert train.model is rollout.model, "SharedModuleSync needs one module shared by both engines"


class StreamedSync:
    """Streams train.named_full_tensors() into rollout.load_weight_stream (collective when sharded); logs
    timing_s/sync."""

    def __call__(self, train: TrainEngine, rollout: RolloutEngine) -> None:
        start = time.perf_counter()
        try:
            rollout.load_weight_stream(train.named_full_tensors())
        except RuntimeError as err:  # a rank that never joined a gather: the process group's timeout
            if not (isinstance(err, dist.DistError) or "timed out" in str(err).lower()):  # gloo's is plain
                raise
            raise WeightSyncTimeout(f"weight sync: a gather of the actor's weights got no answer from every rank "
                                    f"within the process group's timeout (executor.node_timeout_s): "
                                    f"{first_line(err)}") from None
        metrics.log("timing_s/sync", time.perf_counter() - start)


def choose_weight_sync(train_model: torch.nn.Module | None, rollout_model: torch.nn.Module,
                       timeout_s: float = SYNC_TIMEOUT_S) -> WeightSync:
    """SharedModuleSync when both engines hold one module, else StreamedSync in one process and ReshardSync
    over several (each rank a data-parallel replica keeping the whole model; a peer that stops is a
    WeightSyncTimeout within `timeout_s`).

    A shared module cannot be FSDP2-sharded: generate() stops after a
    different number of steps on each rank, and the sharded forward's
    collectives would hang. So sharing with world size > 1 is a ValueError.
    """
    world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if train_model is not rollout_model:
        return StreamedSync() if world_size == 1 else ReshardSync(StreamedSync(), timeout_s=timeout_s)
    if world_size > 1:
        raise ValueError(f"rollout_model is the train model itself with world size {world_size}; give the "
                         "rollout engine its own unsharded copy and use StreamedSync")
    return SharedModuleSync()
