"""Weight transports by name: `sync.transport` picks an entry of TRANSPORTS, whose config builds the transport.

Like the engines (flowrl.engines.configs), validating the `sync` section picks the registered config class
by its `transport` key; what a transport can reach (a follower in its source's process, or apart from it)
is a property of its config, so no executor compares transport names:

- `in_process`: the rollout engine is in the train engine's process (the hybrid engine, each torchrun
  rank's rollout copy); the entries stream by reference (flowrl.engines.weights.in_process.StreamedSync).
- `collective`: the rollout is in other processes (split Ray pools, other nodes), over a group of its own
  of the train ranks and the rollout ranks: each train rank sends each rollout rank only the rows of its
  FSDP2 shard that rank keeps (`reshard`, flowrl.engines.weights.reshard_sync.ReshardTransport), or (reshard=false,
  or a LoRA actor) train rank 0 broadcasts every full tensor (flowrl.engines.weights.buckets).
- `auto`: whichever the placement needs.

    TRANSPORTS.register("rdma", "mypackage.rdma:RDMATransportConfig")
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flowrl.engines.weights.reshard_sync import ReshardShape, ReshardTransport
from flowrl.engines.weights.in_process import StreamedSync
from flowrl.engines.weights.buckets import SYNC_TIMEOUT_S, CollectiveTransport, SyncGroup
from flowrl.graph.registry import Registry


class TransportConfig(BaseModel):
    """The run config's `sync` section; validating a dict against the base picks the class by `transport`."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)
    registry: ClassVar[Registry[type["TransportConfig"]]] = Registry("weight transport")
    transport: str = Field("auto", description="How the actor's weights reach the rollout, by registered name "
                           "(flowrl.engines.weights.transport_configs.TRANSPORTS): 'in_process' streams them by "
                           "reference where both share a process (the hybrid engine, each torchrun rank's rollout copy); "
                           "'collective' broadcasts buckets from train rank 0 over a group of its own with the "
                           "rollout ranks (split Ray pools, NCCL on CUDA, gloo on CPU); 'auto': whichever the "
                           "placement needs. None builds a full state dict.")
    bucket_mb: int = Field(256, ge=1, description="Collective transport: MB per bucket (the reshard: of each "
                                                  "rank's send and receive buffers; the broadcast: two in flight "
                                                  "at most).")
    reshard: bool = Field(True, description="Collective transport: each train rank sends each rollout rank only "
                          "what that rank keeps of its shard (flowrl.engines.weights.reshard_sync); false: train rank 0 "
                          "broadcasts every full tensor, gathered on every train rank.")
    timeout_s: float = Field(SYNC_TIMEOUT_S, gt=0, description="A weight transfer whose peer has not answered within this "
                             "many seconds is an error naming it (executor.node_timeout_s bounds it too, if shorter).")

    @model_validator(mode="wrap")
    @classmethod
    def _dispatch(cls, data: Any, handler: Any) -> Any:
        if isinstance(data, dict) and cls is TransportConfig:  # the base: pick the transport
            name = data.get("transport", "auto")
            if not isinstance(name, str) or name not in cls.registry:
                raise ValueError(f"transport: unknown {name!r}; registered: {cls.registry.names()}")
            return cls.registry.get(name).model_validate(data)
        return handler(data)

    def reaches(self, apart: bool) -> bool:
        """Whether it moves weights to a follower in another process (`apart`) or in its source's own."""
        raise NotImplementedError(f"{type(self).__name__} must implement reaches()")

    def check(self, follower: str, source: str, apart: bool) -> None:
        """A one-line ValueError when this transport cannot move `source`'s weights to `follower`."""
        if not self.reaches(apart):
            where = "in other processes" if apart else "in one process"
            raise ValueError(f"sync.transport={self.transport} does not fit the placement: {follower} and {source} "
                             f"are {where}; use auto")

    def build(self, apart: bool, group: SyncGroup | None = None, reshard: ReshardShape | None = None) -> Any:
        """What moves the weights: StreamedSync in one process; across processes, over `group`, the
        ReshardTransport when given the `reshard` shape (group: every train rank, then the follower's ranks),
        else the CollectiveTransport (group: train rank 0, then the follower's ranks)."""
        self.check("the follower", "its source", apart)
        if not apart:
            return StreamedSync()
        assert group is not None, "a transport across processes needs its sync group"
        if reshard is not None:
            return ReshardTransport(group, reshard, self.bucket_mb << 20)
        return CollectiveTransport(group, self.bucket_mb << 20)


class AutoTransportConfig(TransportConfig):
    def reaches(self, apart: bool) -> bool:
        return True


class InProcessTransportConfig(TransportConfig):
    def reaches(self, apart: bool) -> bool:
        return not apart


class CollectiveTransportConfig(TransportConfig):
    def reaches(self, apart: bool) -> bool:
        return apart


TRANSPORTS = TransportConfig.registry
TRANSPORTS.register("auto", AutoTransportConfig)
TRANSPORTS.register("in_process", InProcessTransportConfig)
TRANSPORTS.register("collective", CollectiveTransportConfig)
