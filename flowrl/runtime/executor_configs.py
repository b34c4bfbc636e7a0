"""Executors by name: `executor.name` picks an entry of EXECUTORS, whose config builds the executor.

Like the engines (flowrl.engines.configs), each executor is a registered pydantic config with `build()`.
What differs between executors is a property of its config, so the trainer never compares their names:
whether its CUDA GPUs are a cluster's rather than this process's (`uses_cluster_gpus`), whether torchrun may
launch it (`check_world`), one GPU's memory (`gpu_bytes`), and which executor.* options only it reads
(`OPTIONS`: set under another executor, they warn). Executors get a RoleFactory and plans, never the run
config. Ray stays optional: the Ray executor's modules are imported only when it is built.

    EXECUTORS.register("dask", "mypackage.dask_executor:DaskExecutorConfig")
"""

from __future__ import annotations

import os
import warnings
from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from flowrl.config import ExecutorSection, RunConfig
from flowrl.engines.weights.transport_configs import TransportConfig
from flowrl.graph.registry import Registry
from flowrl.plan.planner import Plan
from flowrl.runtime.offpolicy import buffering
from flowrl.runtime.executor import Executor, LocalExecutor
from flowrl.runtime.factory import RoleFactory


class ExecutorConfig(BaseModel):
    """An executor's options: the run config's executor section, its train.device and its `sync`. The executor
    it builds keeps this config (`self.config`) instead of copying its fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    registry: ClassVar[Registry[type["ExecutorConfig"]]] = Registry("executor")
    OPTIONS: ClassVar[tuple[str, ...]] = ()  # executor.* fields this executor reads and the local one does not
    CLUSTER: ClassVar[bool] = False  # places pools on a cluster: their strategy and resources apply
    options: ExecutorSection = Field(default_factory=ExecutorSection)
    device: str
    sync: TransportConfig = Field(default_factory=lambda: TransportConfig.model_validate({}))

    @classmethod
    def from_run(cls, cfg: RunConfig) -> "ExecutorConfig":
        return cls(options=cfg.executor, device=cfg.train.device, sync=cfg.sync)

    @property
    def name(self) -> str:
        return self.options.name

    @property
    def uses_cluster_gpus(self) -> bool:
        """On CUDA, the GPUs are the cluster's, not this process's (placement 'auto' counts them there)."""
        return self.CLUSTER and self.device == "cuda"

    def reads(self) -> tuple[str, ...]:
        """The executor-specific executor.* options this run reads."""
        return self.OPTIONS

    def check_world(self, world: int) -> None:
        """Refuse a launch it cannot run under (`world` processes started by torchrun)."""

    def cluster_gpus(self) -> int:
        raise NotImplementedError(f"executor.name={self.name} places nothing on a cluster")

    def gpu_bytes(self) -> int:
        """Memory of one GPU the pools run on."""
        return torch.cuda.get_device_properties(0).total_memory

    def build(self, plan: Plan, factory: RoleFactory, world: int, evaluation: Plan | None) -> Executor:
        """The executor for `plan`; its roles include those the evaluation plan uses."""
        raise NotImplementedError(f"{type(self).__name__} must implement build()")

    def warn_no_effect(self, cfg: RunConfig) -> None:
        """Warn for each executor-specific option set away from its default that this executor ignores."""
        default = ExecutorSection()
        for owner in EXECUTORS:
            for key in EXECUTORS.get(owner).OPTIONS:
                if key not in self.reads() and getattr(self.options, key) != getattr(default, key):
                    warnings.warn(f"executor.{key} has no effect: executor.name is not {owner!r}", stacklevel=3)
        if self.options.rollout_share is not None and not (cfg.placement == "auto" and self.uses_cluster_gpus):
            warnings.warn("executor.rollout_share has no effect: it splits the GPUs of placement 'auto' under an "
                          "executor on a cluster's GPUs (executor.name=ray on train.device=cuda)", stacklevel=3)
        pinned = [p.name for p in getattr(cfg.placement, "pools", ()) if p.resources or p.strategy != "PACK"]
        if pinned and not self.CLUSTER:
            warnings.warn(f"placement: pool {pinned[0]!r}'s strategy and resources have no effect: executor.name "
                          f"{self.name!r} places no pools on a cluster", stacklevel=3)


class LocalExecutorConfig(ExecutorConfig):
    """`executor.name=local`: every role in this process (one rank, or one per torchrun rank)."""

    def reads(self) -> tuple[str, ...]:
        torchrun = int(os.environ.get("WORLD_SIZE", "1")) > 1  # node_timeout_s bounds its collectives
        return ("node_timeout_s",) if torchrun else ()

    def build(self, plan: Plan, factory: RoleFactory, world: int, evaluation: Plan | None) -> Executor:
        for follower, source in plan.weight_links():
            self.sync.check(follower, source, apart=False)  # the rollout shares its source's process
        names = tuple(dict.fromkeys((*plan.roles, *(evaluation.roles if evaluation else ()))))
        pools = list(plan.pools.values())  # under torchrun every pool spans all ranks (LocalExecutor checks it)
        local = factory.per_rank(pools[0]) if pools else factory
        return LocalExecutor(plan, local.build(names), world_size=world, gc_freeze=self.options.gc_freeze)


class RayExecutorConfig(ExecutorConfig):
    """`executor.name=ray`: one Ray actor per rank of each placement pool, started from this one process."""

    OPTIONS: ClassVar[tuple[str, ...]] = ("node_timeout_s", "ship_files", "placement_timeout_s")
    CLUSTER: ClassVar[bool] = True

    def check_world(self, world: int) -> None:
        if world > 1:
            raise ValueError("executor.name: 'ray' starts its own workers from one process; run it without "
                             "torchrun")

    def cluster_gpus(self) -> int:
        """The Ray cluster's GPUs; none is a one-line error."""
        need_ray()
        from flowrl.runtime.ray.executor import init_ray  # first: it imports Ray for a local cluster at 127.0.0.1

        import ray

        init_ray()
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus == 0:
            raise ValueError(f"placement 'auto': train.device is 'cuda', but the Ray cluster has no GPU (it has "
                             f"{ray.cluster_resources()}); start the nodes with GPUs or set train.device=cpu")
        return gpus

    def gpu_bytes(self) -> int:
        from flowrl.runtime.ray.cluster import gpu_memory

        return gpu_memory()

    def build(self, plan: Plan, factory: RoleFactory, world: int, evaluation: Plan | None) -> Executor:
        buffering.refuse_stream(plan)  # before Ray is imported or a cluster starts
        need_ray()
        from flowrl.runtime.ray.executor import RayExecutor, init_ray  # ray is optional: imported only when asked

        init_ray()
        return RayExecutor(plan, factory, self, extra_driver_roles=evaluation.driver_roles() if evaluation else ())


def need_ray() -> None:
    """executor.name=ray without Ray installed: one line naming the extra, not a ModuleNotFoundError."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ValueError("executor.name=ray needs Ray: install the checkout's ray extra, pip install -e '.[ray]'")


EXECUTORS = ExecutorConfig.registry
EXECUTORS.register("local", LocalExecutorConfig)
EXECUTORS.register("ray", RayExecutorConfig)


def executor_config(cfg: RunConfig) -> ExecutorConfig:
    """The config of the executor `executor.name` names; an unknown name is one line naming the field."""
    name = cfg.executor.name
    if name not in EXECUTORS:
        raise ValueError(f"executor.name: unknown {name!r}; registered: {EXECUTORS.names()}")
    return EXECUTORS.get(name).from_run(cfg)
