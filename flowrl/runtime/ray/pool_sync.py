"""Weight sync between split pools on Ray: the follower (the rollout) on a pool other than its weight source's
(the actor's) gets the source's weights over a group of their own, formed once per pair.

- The reshard (sync.reshard and a source that offers FSDP2 shards): every rank of the source sends each rank
  of the follower only the rows of its shard that rank keeps (flowrl.engines.weights.reshard_sync).
- Otherwise (sync.reshard=false, a LoRA actor) the source's rank 0 broadcasts gathered entries in buckets
  (flowrl.engines.weights.buckets); a vllm_server follower on CUDA joins vLLM's own NCCL transfer
  (flowrl.engines.vllm.server_weights).
- A sync runs only when the source was updated since the last one; a group that does not form, or a rank that
  stops sending, is a WeightSyncTimeout within sync.timeout_s (or executor.node_timeout_s where shorter).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import ray
from ray.exceptions import GetTimeoutError

from flowrl.engines.vllm.server_weights import NcclLayout
from flowrl.engines.weights.buckets import WeightSyncTimeout
from flowrl.engines.weights.reshard_sync import ReshardShape
from flowrl.engines.weights.transport_configs import TransportConfig
from flowrl.graph.trace import Node
from flowrl.plan.planner import Plan
from flowrl.runtime.executor import VersionBook
from flowrl.runtime.ray.nodes import Launched, remote_cause


class PoolSync:
    """The split pools' weight syncs of one Ray executor: `workers_of(role)` gives the role's pool's workers,
    `book` the executor's version book; `groups` the pairs whose group has formed (shared by views)."""

    def __init__(self, plan: Plan, sync: TransportConfig, node_timeout_s: float | None, book: VersionBook,
                 workers_of: Callable[[str], list[Any]]):
        self.plan, self.sync, self.node_timeout_s, self.book, self.workers_of = \
            plan, sync, node_timeout_s, book, workers_of
        self.groups: set[str] = set()
        for role in plan.pools:  # sync.transport must reach each follower: in its source's process or apart
            source = plan.specs[role].weights_from
            if source in plan.pools:
                sync.check(role, source, apart=self.source_of(role) is not None)

    def for_plan(self, plan: Plan) -> "PoolSync":
        """The same groups and book under another plan over these pools (an executor's view)."""
        view = copy.copy(self)
        view.plan = plan
        return view

    def source_of(self, role: str) -> str | None:
        """The role's weight source when it lives on another pool (its weights must be sent), else None."""
        source = self.plan.specs[role].weights_from
        if source not in self.plan.pools or self.plan.pools[source] is self.plan.pools[role]:
            return None
        return source

    def launch(self, node: Node, start: float) -> Launched:
        """The source's weights into every rank of the follower, only when the source was updated since the
        last sync: the load calls are the launch's batches, the send calls' metrics among its logged."""
        source = self.source_of(node.role)
        version = self.book.updates[source]
        if self.book.synced.get(node.role) == version:
            return Launched(node, [], [], start)
        key = f"{source}->{node.role}"
        if key not in self.groups:
            self.open(key, source, node.role)
        sent = [w.send_weights.remote(source, key) for w in self.workers_of(source)]  # every rank takes part
        loaded = [w.receive_weights.remote(node.role, key, version) for w in self.workers_of(node.role)]
        self.book.synced[node.role] = version
        return Launched(node, [b for b, _ in loaded], [*sent, *(m for _, m in loaded)], start)

    def open(self, key: str, source: str, follower: str) -> None:
        """The weight-sync group (NCCL when both pools are on CUDA, else gloo), formed once: every rank of the
        source and of the follower for the reshard, else the source's rank 0 and every rank of the follower."""
        senders, receivers = self.workers_of(source), self.workers_of(follower)
        timeout = self.timeout_s()
        workers = ray.get(receivers[0].server_workers.remote(follower), timeout=timeout)  # vLLM's NCCL transfer
        server = (NcclLayout(len(receivers), workers), follower) if workers else None
        reshard = None if server else self.reshard_shape(source, follower, timeout)
        senders = senders if reshard is not None else senders[:1]
        size = len(senders) + len(receivers)
        pools = (self.plan.pools[source], self.plan.pools[follower])
        device = "cuda" if all(p.device == "cuda" for p in pools) else "cpu"
        host, port = ray.get(senders[0].open_weight_sync.remote(key, size, timeout), timeout=timeout)
        joined = [w.join_weight_sync.remote(key, host, port, rank, size, device, timeout, self.sync, reshard, server)
                  for rank, w in enumerate((*senders, *receivers))]
        try:
            ray.get(joined, timeout=timeout + 10)
        except GetTimeoutError:
            raise WeightSyncTimeout(f"weight sync {key}: the group of {size} ranks did not form within "
                                    f"{timeout:g} s") from None
        except WeightSyncTimeout as err:
            raise WeightSyncTimeout(remote_cause(err)) from None
        self.groups.add(key)

    def reshard_shape(self, source: str, follower: str, timeout: float) -> ReshardShape | None:
        """What the reshard plans from (the source's entries and heads, the follower's tensor-parallel ranks);
        None under sync.reshard=false or for a source that must gather (LoRA)."""
        if not self.sync.reshard:
            return None
        layout = ray.get(self.workers_of(source)[0].weight_layout.remote(source), timeout=timeout)
        if layout is None:
            return None
        tp = ray.get(self.workers_of(follower)[0].tensor_ranks.remote(follower), timeout=timeout)
        return ReshardShape(*layout, num_train=len(self.workers_of(source)), tp=tp)

    def timeout_s(self) -> float:
        """sync.timeout_s, or executor.node_timeout_s where that is shorter."""
        return min(self.sync.timeout_s, self.node_timeout_s or self.sync.timeout_s)
