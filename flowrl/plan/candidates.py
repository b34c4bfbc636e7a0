"""Candidates: every layout the planner may choose for a graph on a cluster, before memory and time judge them.

A candidate places the model roles on one pool of all the GPUs (colocated: the hybrid engine) or splits them:
the rollout (the roles that follow weights) on `rollout_gpus`, the rest on `train_gpus`, each pool within one
node or of whole nodes. On top: the rollout engine (hf_static, or vLLM with CUDA graphs) with its tensor
parallel size k (k GPUs one engine spans; a pool of N gives N / k replicas), vLLM's memory share
(gpu_memory_utilization) and sleep level on a shared pool; the train engines' activation checkpointing,
optimizer and parameter offload, and rows per micro-batch. `Space` says what may vary: a value the user set
is fixed, and LoRA is tried only where the user allows it (it changes the math).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Iterator

from flowrl.plan.cluster import ClusterConfig

ENGINES = ("hf_static", "vllm")


@dataclass(frozen=True)
class Work:
    """One step's load: rows (responses), their lengths, and the update's batching."""

    rows: int
    prompt_len: int
    response_len: int  # the longest response (max_new_tokens)
    mean_response_len: float  # expected mean response length (long-tailed work: well under the longest)
    mini_batch_size: int
    epochs: int = 1

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    def update_tokens(self) -> float:
        """Tokens an update computes (rows padded to the longest of their micro-batch: between mean and max)."""
        return self.rows * (self.prompt_len + (self.mean_response_len + self.response_len) / 2)


@dataclass(frozen=True)
class Candidate:
    train_gpus: int
    rollout_gpus: int  # 0: the rollout shares the train pool (colocated)
    engine: str = "hf_static"
    tensor_parallel: int = 1
    gpu_memory_utilization: float = 0.0  # vLLM only
    sleep_level: int = 0  # vLLM on a shared pool: 1 weights to CPU and KV cache freed, 2 both freed
    gradient_checkpointing: bool = False
    offload_optimizer: bool = False
    offload_params: bool = False
    micro_batch_size: int = 1  # rows per forward/backward pass, over the train pool
    lora_rank: int = 0
    token_budget: int = 0  # tokens per micro-batch and rank (max_tokens_per_micro_batch); 0: micro_batch_size rows
    enforce_eager: bool = True  # vLLM only: False captures CUDA graphs (faster decode steps, a graph pool)

    @property
    def colocated(self) -> bool:
        return self.rollout_gpus == 0

    @property
    def rollout_pool(self) -> int:
        return self.train_gpus if self.colocated else self.rollout_gpus

    @property
    def replicas(self) -> int:
        return self.rollout_pool // self.tensor_parallel

    def vllm_mode(self) -> str:
        """'graphs' (CUDA graphs), 'eager' (enforce_eager) or '-' (not vLLM)."""
        return "-" if self.engine != "vllm" else "eager" if self.enforce_eager else "graphs"

    def label(self) -> str:
        layout = f"colocated {self.train_gpus}" if self.colocated else f"train {self.train_gpus} | " \
                                                                         f"rollout {self.rollout_gpus}"
        engine = self.engine if self.engine != "vllm" else \
            f"vllm {self.vllm_mode()} tp{self.tensor_parallel}x{self.replicas} mem {self.gpu_memory_utilization:g}" + \
            (f" sleep {self.sleep_level}" if self.colocated else "")
        opts = [name for name, on in (("ckpt", self.gradient_checkpointing), ("offload-opt", self.offload_optimizer),
                                      ("offload-params", self.offload_params)) if on]
        opts += [f"lora {self.lora_rank}"] if self.lora_rank else []
        micro = f"tokens {self.token_budget}" if self.token_budget else f"micro {self.micro_batch_size}"
        return f"{layout}; {engine}; {micro}" + (f"; {', '.join(opts)}" if opts else "")


@dataclass(frozen=True)
class Space:
    """What the planner may vary; a field with one value is fixed (the user set it)."""

    engines: tuple[str, ...] = ENGINES
    tensor_parallel: tuple[int, ...] | None = None  # None: any that divides the pool
    memory_shares: tuple[float, ...] = (0.3, 0.5, 0.7, 0.9)
    sleep_levels: tuple[int, ...] = (0, 1, 2)
    enforce_eager: tuple[bool, ...] | None = None  # None: CUDA graphs or eager on CUDA, eager elsewhere
    gradient_checkpointing: tuple[bool, ...] = (False, True)
    offload_optimizer: tuple[bool, ...] = (False, True)
    offload_params: tuple[bool, ...] = (False, True)
    micro_batch_sizes: tuple[int, ...] | None = None  # None: powers of two per rank up to the mini-batch
    lora_ranks: tuple[int, ...] = (0,)
    split: tuple[bool, ...] = (False, True)  # colocated and split layouts
    extra: dict[str, object] = field(default_factory=dict)


def layouts(cluster: ClusterConfig, space: Space, has_rollout: bool) -> Iterator[tuple[int, int]]:
    """(train GPUs, rollout GPUs) pairs: all on one pool, or split by pool sizes the nodes allow."""
    total = cluster.gpus
    if False in space.split or not has_rollout:
        yield total, 0
    if True in space.split and has_rollout:
        sizes = set(cluster.pool_sizes())
        for rollout in sorted(sizes):
            if rollout < total and total - rollout in sizes:
                yield total - rollout, rollout


def micro_sizes(train_gpus: int, work: Work, space: Space) -> list[int]:
    if space.micro_batch_sizes is not None:
        return list(space.micro_batch_sizes)
    sizes, per_rank = [], 1
    while per_rank * train_gpus <= work.mini_batch_size and work.mini_batch_size % (per_rank * train_gpus) == 0:
        sizes.append(per_rank * train_gpus)
        per_rank *= 2
    return sizes[-4:] or [train_gpus]


def rollout_options(cluster: ClusterConfig, first: int, pool: int, colocated: bool, space: Space
                    ) -> Iterator[tuple[str, int, float, int, bool]]:
    """(engine, tensor parallel size, memory share, sleep level, enforce_eager) for a rollout pool of `pool` GPUs
    from GPU `first`: tensor parallel sizes whose groups stay within a node (one the user fixed is kept, and
    refused by flowrl.plan.memory.refusal), CUDA graphs (unless the user fixed them) and sleep levels on a CUDA
    device kind only."""
    for engine in space.engines:
        if engine != "vllm":
            yield engine, 1, 0.0, 0, True
            continue
        sizes = space.tensor_parallel or tuple(k for k in (1, 2, 4, 8) if k <= pool and
                                               cluster.tensor_parallel_span(first, pool, k) is None)
        levels = space.sleep_levels if colocated and cluster.kind.cuda else (0,)
        eager = space.enforce_eager or ((False, True) if cluster.kind.cuda else (True,))
        for k, share, level, mode in itertools.product(sizes, space.memory_shares, levels, eager):
            yield engine, k, share, level, mode


def enumerate_candidates(cluster: ClusterConfig, work: Work, space: Space, has_rollout: bool = True,
                         ) -> Iterator[Candidate]:
    for train, rollout in layouts(cluster, space, has_rollout):
        pool = train if rollout == 0 else rollout
        train_opts = list(itertools.product(space.gradient_checkpointing, space.offload_optimizer,
                                            space.offload_params, micro_sizes(train, work, space), space.lora_ranks))
        first = 0 if rollout == 0 else train  # the train pool's ranks come first
        for engine, k, share, level, eager in rollout_options(cluster, first, pool, rollout == 0, space) \
                if has_rollout else [("hf_static", 1, 0.0, 0, True)]:
            for ckpt, off_opt, off_params, micro, lora in train_opts:
                if off_params and off_opt:  # offload_params keeps the optimizer on the CPU already
                    continue
                yield Candidate(train, rollout, engine, k, share, level, ckpt, off_opt, off_params, micro, lora,
                                enforce_eager=eager)
