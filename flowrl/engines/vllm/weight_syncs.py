"""How a train engine's weights reach the in-process vLLM engine (flowrl.engines.vllm.rollout): streamed whole
into vLLM's reload (`StreamedWeightSync`; under several ranks it is ReshardSync's local step), or, for a LoRA
actor with roles.rollout.max_lora_rank > 0, the adapter alone (`AdapterSync`)."""

from __future__ import annotations

import tempfile
import time
from typing import Any, Iterator

import torch

from flowrl import metrics
from flowrl.engines.protocols import TrainEngine


class StreamedWeightSync:
    """Streams the train engine's unsharded tensors into a VLLMRolloutEngine in this process; logs timing_s/sync,
    rollout/sync_buckets and sync/loaded_mb (the bytes streamed: no rank sends or receives any)."""

    def __call__(self, train: TrainEngine, rollout: Any) -> None:
        start, loaded = time.perf_counter(), [0]

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in train.named_full_tensors():
                loaded[0] += tensor.numel() * tensor.element_size()
                yield name, tensor

        count = rollout.load_weight_stream(counted())
        metrics.log("timing_s/sync", time.perf_counter() - start)
        metrics.log("rollout/sync_buckets", count)
        metrics.log("sync/loaded_mb", loaded[0] / 2**20)


class AdapterSync:
    """Sends a LoRA actor's adapter (gathered, collective when sharded) to a VLLMRolloutEngine as a LoRARequest;
    the base weights vLLM loaded at start stay. Logs timing_s/sync. The adapters are written inside one
    temporary folder of its own, removed with it (at the latest as the process exits, an error's exit too)."""

    def __init__(self) -> None:
        self.root = tempfile.TemporaryDirectory(prefix="flowrl-lora-")

    def __call__(self, train: TrainEngine, rollout: Any) -> None:
        start = time.perf_counter()
        folder = tempfile.mkdtemp(prefix="adapter-", dir=self.root.name)
        rollout.use_adapter(train.save_adapter(folder))
        metrics.log("timing_s/sync", time.perf_counter() - start)
