"""Placement: which resource pool hosts which roles.

A pool is a set of workers (a world of ranks on one device type) hosting one
or more roles. Roles in one pool are colocated: they share the workers and, for
a role and the role whose weights it follows at world size 1, the very same
module (the hybrid engine moves no weights). Roles in different pools each
hold their own copy.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from flowrl.errors import PlanError
from flowrl.graph.role import ROLES

DRIVER = "driver"


class Pool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="Pool name, unique in the placement.")
    roles: list[str] = Field(description="Roles hosted by this pool's workers.")
    world_size: int = Field(1, ge=1, description="Workers (ranks) in the pool.")
    device: Literal["cpu", "cuda"] = Field("cpu", description="Device type of the pool's workers.")
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray executor: how the pool's ranks (one placement-group bundle each) spread over "
                            "nodes; PACK fills a node before the next.")
    gpus_per_rank: int = Field(1, ge=1, description="Ray executor, CUDA: GPUs each rank's bundle holds. Set by the "
                               "plan, not by hand: a pool of N GPUs hosting a rollout whose replica is one process "
                               "spanning tensor_parallel_size k GPUs (roles.rollout.engine=vllm_server) runs N / k "
                               "ranks of k GPUs each (flowrl.runtime.layout.planning.tensor_parallel_ranks).")
    resources: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict, description="Ray executor: resources each rank "
                                        "asks for besides a CPU share and its GPU, e.g. a custom resource a node "
                                        "was started with (ray start --resources='{\"trainer\": 8}') to pin the "
                                        "pool to it.")

    @field_validator("roles")
    @classmethod
    def _known_roles(cls, roles: list[str]) -> list[str]:
        for role in roles:
            if role not in ROLES:
                raise ValueError(f"unknown role {role!r}; registered roles are {ROLES.names()}")
        return roles

    def share(self, total: int, field: str) -> int:
        """One rank's share of a global count (the train.* batch sizes count rows summed over the pool's ranks,
        as verl's ppo_mini_batch_size does): the one per-rank split, under torchrun and in a Ray pool alike."""
        if total % self.world_size:
            raise ValueError(f"{field}={total} must be divisible by the world_size {self.world_size} of pool "
                             f"{self.name!r}")
        return total // self.world_size


class Placement(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pools: list[Pool] = Field(description="Resource pools; a role absent from every pool runs on the driver "
                                          "(allowed for roles registered on_driver only, e.g. reward).")

    @classmethod
    def colocated(cls, roles: tuple[str, ...] | None = None, world_size: int = 1, device: str = "cpu") -> "Placement":
        """The given roles (default: every registered role that needs a pool) on one pool: the hybrid engine."""
        if roles is None:
            roles = tuple(name for name in ROLES if not ROLES.get(name).on_driver)
        return cls(pools=[Pool(name="global", roles=list(roles), world_size=world_size, device=device)])

    def pool_of(self) -> dict[str, Pool]:
        owner: dict[str, Pool] = {}
        names: set[str] = set()
        for pool in self.pools:
            if pool.name in names or pool.name == DRIVER:
                raise PlanError(f"placement.pools: pool name {pool.name!r} is used twice or reserved")
            names.add(pool.name)
            for role in pool.roles:
                if role in owner:
                    raise PlanError(f"placement: role {role!r} is in pools {owner[role].name!r} and {pool.name!r}")
                owner[role] = pool
        return owner
