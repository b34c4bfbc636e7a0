"""PoolWorker: one rank of a pool, as a Ray actor holding that pool's roles.

The driver (flowrl.runtime.ray_executor) creates one per rank. `setup` joins
the pool's own torch.distributed process group when the pool has several
ranks (gloo on CPU, NCCL on CUDA), so train engines shard with FSDP2 across
exactly that pool's workers, then builds only the pool's roles with the
pool's RoleFactory. Every other method is a thin call into a role or its
engine; collectives (FSDP forwards, updates, full_state_dict, save) work
because the driver calls every rank of a pool.
"""

from __future__ import annotations

import random
from typing import Any

import ray
import torch
import torch.distributed as dist
import transformers
from tensordict import TensorDict

from flowrl import metrics
from flowrl.graph.context import CallInfo
from flowrl.graph.trace import Node
from flowrl.runtime.scheduling import call_role


class PoolWorker:
    def setup(self, factory: Any, names: tuple[str, ...], device: str, rank: int, world_size: int,
              address: str) -> None:
        """Join the pool's process group (world_size > 1) and build the roles in `names`."""
        if world_size > 1:
            if device == "cuda":
                torch.cuda.set_device(0)  # Ray makes this worker's one GPU the only visible device
            dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=address, rank=rank,
                                    world_size=world_size)
        transformers.utils.logging.disable_progress_bar()
        random.seed(factory.seed)
        torch.manual_seed(factory.seed)
        self.roles = factory.build(names)

    @ray.method(num_returns=2)
    def call(self, node: Node, batch: TensorDict, info: CallInfo,
             keep: tuple[str, ...] | None) -> tuple[TensorDict, dict[str, float]]:
        """The node's role method on this rank's rows and the metrics it logged; only `keep` fields (None: all)
        return."""
        with metrics.collect() as logged:
            out = call_role(node, self.roles[node.role], batch, info)
        return (out if keep is None else out.select(*keep)), logged

    def full_state_dict(self, role: str) -> dict[str, torch.Tensor]:
        """The role's unsharded weights (collective: every rank of the pool calls it)."""
        return self.roles[role].engine.full_state_dict()

    def load_weights(self, role: str, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.roles[role].load_weights(state_dict, version)

    def set_version(self, role: str, version: int) -> None:
        self.roles[role].version = version

    def save(self, role: str, path: str) -> None:
        self.roles[role].engine.save(path)

    def load(self, role: str, path: str) -> None:
        self.roles[role].engine.load(path)

    def save_pretrained(self, role: str, path: str, tokenizer: Any) -> None:
        self.roles[role].engine.save_pretrained(path, tokenizer)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
