"""How a train engine's weights reach the in-process vLLM engine (flowrl.engines.vllm.rollout): streamed whole
into vLLM's reload (`StreamedWeightSync`; under several ranks it is ReshardSync's local step), or, for a LoRA
actor with roles.rollout.max_lora_rank > 0, the adapter alone (`AdapterSync`)."""

from __future__ import annotations

import tempfile
import time
from typing import Any

from flowrl import metrics
from flowrl.engines.protocols import TrainEngine


class StreamedWeightSync:
    """Streams the train engine's unsharded tensors into a VLLMRolloutEngine; logs timing_s/sync."""

    def __call__(self, train: TrainEngine, rollout: Any) -> None:
        start = time.perf_counter()
        count = rollout.load_weight_stream(train.named_full_tensors())
        metrics.log("timing_s/sync", time.perf_counter() - start)
        metrics.log("rollout/sync_buckets", count)


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
