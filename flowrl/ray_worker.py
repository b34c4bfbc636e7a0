"""PoolWorker: one rank of a pool, as a Ray actor holding that pool's roles.

The driver (flowrl.ray_executor) creates one per rank. `setup` joins the
pool's own torch.distributed process group when the pool has several ranks
(gloo on CPU, NCCL on CUDA), so train engines shard with FSDP2 across exactly
that pool's workers, then builds only the pool's roles. Every other method is
a thin call into a role or its engine; collectives (FSDP forwards, updates,
full_state_dict, save) work because the driver calls every rank of a pool.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

import ray
import torch
import torch.distributed as dist
import transformers
from tensordict import TensorDict

from flowrl import metrics
from flowrl.config import RunConfig

Builder = Callable[[RunConfig, tuple[str, ...], bool, Any, Path], dict[str, Any]]


class PoolWorker:
    def setup(self, cfg: RunConfig, names: tuple[str, ...], shares_actor_module: bool, path: Path,
              builder: Builder, rank: int, world_size: int, address: str) -> None:
        """Join the pool's process group (world_size > 1) and build the roles in `names`."""
        device = cfg.train.device
        if world_size > 1:
            if device == "cuda":
                torch.cuda.set_device(0)  # Ray makes this worker's one GPU the only visible device
            dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=address, rank=rank,
                                    world_size=world_size)
        transformers.utils.logging.disable_progress_bar()
        random.seed(cfg.train.seed)
        torch.manual_seed(cfg.train.seed)
        self.roles = builder(cfg, names, shares_actor_module, None, path)

    @ray.method(num_returns=2)
    def call(self, role: str, method: str, batch: TensorDict, kwargs: dict[str, Any],
             keep: tuple[str, ...] | None) -> tuple[TensorDict, dict[str, float]]:
        """role.method(batch, **kwargs) and the metrics it logged; only the `keep` fields (None: all) return."""
        with metrics.collect() as logged:
            out = getattr(self.roles[role], method)(batch, **kwargs)
        return (out if keep is None else out.select(*keep)), logged

    def begin_step(self, step: int) -> None:
        self.roles["rollout"].begin_step(step)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The actor's unsharded weights (collective: every rank of the pool calls it)."""
        return self.roles["actor"].engine.full_state_dict()

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.roles["rollout"].engine.load_weights(state_dict)

    def set_actor_version(self, version: int) -> None:
        self.roles["actor"].version = version

    def save(self, role: str, path: str) -> None:
        self.roles[role].engine.save(path)

    def load(self, role: str, path: str) -> None:
        self.roles[role].engine.load(path)

    def save_pretrained(self, path: str, tokenizer: Any) -> None:
        self.roles["actor"].engine.save_pretrained(path, tokenizer)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
