"""The Ray executor: a compiled plan over one Ray actor (`PoolWorker`) per rank of each pool.

- Each pool's workers build only that pool's roles; a pool of several ranks is
  its own torch.distributed group (gloo on CPU, NCCL on CUDA), and its train
  engines shard with FSDP2 over it; its ranks build their roles with the
  pool's RoleFactory. Stage nodes and roles on no pool (the reward) run on the
  driver. Where pools go on a cluster of several nodes (placement groups, the
  rendezvous at rank 0's node, model folders, checkpoints and exports moved
  through the object store): flowrl.runtime.ray.cluster.
- A role node splits the batch's rows evenly over its pool's ranks (generate
  splits prompts, so a prompt's samples stay on one rank) and the results are
  concatenated. A node starts once its predecessors in the plan's graph have
  finished, so independent nodes (actor, ref and critic forwards) run at once
  on their pools; the driver waits only for what it needs next. Worker
  metrics come back per call and are averaged over the pool's ranks.
- Weight sync across pools, over a group of its own (flowrl.runtime.ray.pool_sync): every rank of the
  source role (the actor) sends each rank of the following role (the rollout) only the rows of its FSDP2
  shard that rank keeps (no full tensor, no state dict, no object store); with sync.reshard=false or a LoRA
  actor, rank 0 broadcasts gathered entries in buckets.
- A streamed buffer (fl.buffer(stream=True)) with the rollout alone on a pool
  of one rank samples in that worker while the actor trains
  (flowrl.runtime.ray.streaming).
- Workers ask Ray for a sliver of a CPU (they fit on any machine, however
  many pools) and one GPU each on CUDA pools.
- init_ray and the pools' workers: flowrl.runtime.ray.pools; a node's rows
  over the ranks and the errors it ends with: flowrl.runtime.ray.nodes.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Protocol

from flowrl.runtime.ray import loopback as ray_loopback

ray_loopback.use_for_a_local_cluster()  # before Ray reads its constants (at import): a local cluster at 127.0.0.1
import ray  # noqa: E402
from ray.exceptions import GetTimeoutError, RayActorError  # noqa: E402
from tensordict import TensorDict

from flowrl import metrics
from flowrl.config import ExecutorSection
from flowrl.engines.weights.buckets import WeightSyncTimeout
from flowrl.engines.weights.transport_configs import TransportConfig
from flowrl.errors import PlanError
from flowrl.graph.context import StepCalls
from flowrl.graph.role import close_role
from flowrl.graph.trace import Node, NodeKind
from flowrl.plan.placement import DRIVER
from flowrl.runtime.offpolicy import buffering
from flowrl.runtime.ray import cluster as ray_cluster, streaming as ray_streaming
from flowrl.plan.planner import Plan
from flowrl.runtime.distributed import average
from flowrl.runtime.executor import Executor
from flowrl.runtime.ray.nodes import (Launched, NodeTimeout, WorkerDied, checked_nodes, freeze_heaps, merge_outputs,
                                      remote_cause, split_rows)
from flowrl.runtime.ray.pool_sync import PoolSync
from flowrl.runtime.ray.pools import PoolEngine, start_pool, write_folder
from flowrl.runtime.ray.pools import CONNECT_TIMEOUT_S, check_listening, init_ray  # noqa: F401 (re-exported)
from flowrl.runtime.scheduling import call_node, ready

_EMPTY = TensorDict({}, batch_size=[0])


class RayConfig(Protocol):
    """What RayExecutor reads of the config that builds it (flowrl.runtime.executor_configs.RayExecutorConfig)."""

    @property
    def options(self) -> ExecutorSection: ...

    @property
    def sync(self) -> TransportConfig: ...


CLOSE_TIMEOUT_S = 60.0  # the workers' close at the run's end, where executor.node_timeout_s is off


class RayExecutor(Executor):
    def __init__(self, plan: Plan, factory: Any, config: RayConfig, extra_driver_roles: tuple[str, ...] = ()):
        """`factory` (a flowrl.runtime.factory.RoleFactory, or any object with build(names) and for_pool(pool))
        builds the driver's roles here and each pool's roles in its workers. `config` (kept as `self.config`):
        its options are the run's executor section (flowrl.config.ExecutorSection: node_timeout_s, the watchdog;
        ship_files, model folders, checkpoints and exports through the object store, the factory then needing
        folders() and relocated(); placement_timeout_s; cpu_threads, torch's threads in each worker; gc_freeze,
        each worker freezing its heap after the first step, never thawed as the workers end with the executor),
        its `sync` how weights move between split pools (flowrl.engines.weights.transport_configs.TransportConfig)."""
        nodes, _, spread = checked_nodes(plan)
        options = config.options
        super().__init__(plan, nodes, spread, options.gc_freeze, None)
        self.config = config
        self.pool_sync = PoolSync(plan, config.sync, options.node_timeout_s, self.book, self._workers_of)
        buffering.refuse_stream(plan)  # before any worker starts
        pools = {pool.name: pool for pool in plan.pools.values()}
        ray_cluster.check_cluster(list(pools.values()))
        factories = {name: factory.for_pool(pool) for name, pool in pools.items()}  # batch sizes that do not split
        # over a pool are refused here, before any worker starts (not after the first pool's workers import flowrl)
        self.driver_roles = factory.build(tuple(dict.fromkeys((*plan.driver_roles(), *extra_driver_roles))))
        self.groups = ray_cluster.place(list(pools.values()), options.placement_timeout_s)
        self.workers: dict[str, list[Any]] = {}
        try:
            shipped = ray_cluster.ship(factory.folders()) if options.ship_files else None
            setups = []
            for name, pool in pools.items():
                roles = tuple(r for r, p in plan.pools.items() if p.name == name)
                self.workers[name], started = start_pool(pool, self.groups[name], factories[name], roles, shipped,
                                                         options.cpu_threads)
                setups += started
            ray.get(setups)
        except BaseException:
            self.close()
            raise
        self.pipeline = buffering.make(plan, self.nodes, lambda: self.versions, overlap=True, spread=self.spread)
        self.stream = ray_streaming.make(plan, self.nodes, self._workers_of, lambda: self.versions)

    def freeze_heap(self) -> None:
        """Each worker's heap. (A step with a buffer (k >= 1) and the producers on pools of their own runs step
        t+k's producers in a thread beside step t's consumers (flowrl.runtime.offpolicy.buffering); a streamed buffer
        samples on the rollout's pool while the consumers run (flowrl.runtime.ray.streaming).)"""
        freeze_heaps([w for workers in self.workers.values() for w in workers])

    def for_plan(self, plan: Plan) -> "RayExecutor":
        """A view running `plan` (e.g. the evaluation) on these workers; its pools must be among them."""
        for role, pool in plan.pools.items():
            mine = self.plan.pools.get(role)
            if mine is None or (mine.name, mine.world_size) != (pool.name, pool.world_size):
                raise PlanError(f"executor: plan {plan.algorithm} puts role {role!r} on pool {pool.name!r}, "
                                f"which these workers do not host")
        view = copy.copy(self)
        view.plan, view.gc_freeze = plan, False  # the executor's own first step freezes (an evaluation runs first)
        view.pool_sync = self.pool_sync.for_plan(plan)  # the same groups and book
        view.nodes, view.fill_at, view.spread = checked_nodes(plan)  # view.book: this executor's
        view.pipeline = buffering.make(plan, view.nodes, lambda: view.versions, overlap=True, spread=view.spread)
        view.stream = ray_streaming.make(plan, view.nodes, view._workers_of, lambda: view.versions)
        return view

    def train_engines(self) -> dict[str, Any]:
        """What a checkpoint saves and loads: each trainable role on a pool across its ranks, and each trainable
        driver role's own engine (the adaptive KL controller's coefficient), as the local executor does."""
        ship = self.config.options.ship_files
        return buffering.checkpointed({r: PoolEngine(tuple(self._workers_of(r)), r, ship)
                                       if r in self.plan.pools else self.driver_roles[r].engine
                                       for r in self.plan.trainable()}, self.pipeline or self.stream)

    def set_role_versions(self, versions: dict[str, int]) -> None:
        """Set on resume (one past the saved counts), so the first step syncs the followers to the loaded weights."""
        for role, version in versions.items():
            ray.get([w.set_version.remote(role, version) for w in self._workers_of(role)])

    def save_pretrained(self, role: str, path: str, tokenizer: Any = None) -> None:
        """The role's model as a Hugging Face folder (every rank gathers; rank 0 writes)."""
        tokenizer_ref = ray.put(tokenizer)
        target = None if self.config.options.ship_files else path
        saved = ray.get([w.save_pretrained.remote(role, target, tokenizer_ref) for w in self._workers_of(role)])
        if self.config.options.ship_files:
            write_folder({name: data for files in saved for name, data in files.items()}, path)

    def close(self) -> None:
        """Ends the workers (of every view: close only the executor you built) and closes the driver's roles."""
        for instance in self.driver_roles.values():
            close_role(instance)
        stream, self.stream = self.stream, None
        try:
            if stream is not None:
                stream.close()  # its engine, in the rollout's worker
        finally:
            workers = [worker for pool in self.workers.values() for worker in pool]
            # each worker's roles close as a local run's do; one that died or hangs past the deadline is ended all
            # the same
            ray.wait([worker.close.remote() for worker in workers], num_returns=len(workers),
                     timeout=self.config.options.node_timeout_s or CLOSE_TIMEOUT_S)
            for worker in workers:
                ray.kill(worker)
        self.workers = {}
        ray_cluster.release(self.groups)
        self.groups = {}

    def _workers_of(self, role: str) -> list[Any]:
        return self.workers[self.plan.pools[role].name]

    def run_nodes(self, nodes: list[Node], batch: TensorDict, calls: StepCalls) -> TensorDict:
        """Start every node whose predecessors are done, remote ones first; wait only when none can start."""
        todo, inflight, done, segment = list(nodes), [], set(), {node.name for node in nodes}
        while todo or inflight:
            startable = ready(self.plan, todo, segment, done)
            remote = [node for node in startable if node.pool != DRIVER]
            if remote:
                for node in remote:
                    todo.remove(node)
                    inflight.append(self._launch(node, batch, calls))
            elif startable:
                node = startable[0]
                todo.remove(node)
                start = time.perf_counter()
                batch = call_node(node, self.driver_roles, batch, calls)
                metrics.log(f"timing_s/{node.name}", time.perf_counter() - start)
                done.add(node.name)
            else:
                needed = [run for run in inflight if any(self.plan.graph.has_edge(run.node.name, n.name)
                                                         for n in todo)] or inflight
                inflight = [run for run in inflight if run not in needed]
                batch = self._resolve(needed, batch)
                done |= {run.node.name for run in needed}
            if batch.batch_size[0] == 0 and todo and not inflight:
                return batch
        return batch

    def _launch(self, node: Node, batch: TensorDict, calls: StepCalls) -> Launched:
        start = time.perf_counter()
        info = calls.next(node.role, node.method)
        if node.kind is NodeKind.SYNC and self.pool_sync.source_of(node.role) is not None:
            return self.pool_sync.launch(node, start)
        workers = self.workers[node.pool]
        shards = [_EMPTY] * len(workers) if node.kind is NodeKind.SYNC else split_rows(batch, node, len(workers))
        keep = None if node.kind is NodeKind.ROWS else tuple(sorted(node.writes))
        calls_ = [w.call.remote(node, ray.put(shard), info, keep) for w, shard in zip(workers, shards)]
        self.book.counted(node, self.plan)
        return Launched(node, [b for b, _ in calls_], [m for _, m in calls_], start)

    def _resolve(self, done: list[Launched], batch: TensorDict) -> TensorDict:
        """Wait for `done` (one ray.get, under the watchdog) and merge their results into the batch in trace order."""
        values = iter(self._get(done))
        for launched in done:
            outs = [next(values) for _ in launched.batches]
            with metrics.node(launched.node.name):
                for name, value in average([next(values) for _ in launched.logged]).items():
                    metrics.log(name, value)
            metrics.log(f"timing_s/{launched.node.name}", time.perf_counter() - launched.start)
            batch = merge_outputs(launched.node, outs, batch)
        return batch

    def _get(self, done: list[Launched]) -> list[Any]:
        """ray.get of every result; a node past executor.node_timeout_s, or a dead worker, is a named error."""
        refs = [ref for run in done for ref in (*run.batches, *run.logged)]
        timeout = None
        limit = self.config.options.node_timeout_s
        if limit is not None:
            timeout = max(0.0, min(run.start for run in done) + limit - time.perf_counter())
        try:
            return ray.get(refs, timeout=timeout)
        except GetTimeoutError:
            raise NodeTimeout(self._stuck(done)) from None
        except WeightSyncTimeout as err:  # a worker's, which Ray wraps with the remote traceback
            raise WeightSyncTimeout(remote_cause(err)) from None
        except RayActorError as err:
            raise WorkerDied(f"a worker died while running {', '.join(r.node.label() for r in done)}: "
                             f"{' '.join(str(err).split())[:300]}; rerun to resume from the last checkpoint") from None

    def _stuck(self, done: list[Launched]) -> str:
        ready, _ = ray.wait([ref for run in done for ref in run.batches], num_returns=sum(len(r.batches) for r in done),
                            timeout=0)
        finished = set(ready)
        stuck = [(run, [rank for rank, ref in enumerate(run.batches) if ref not in finished]) for run in done]
        run, ranks = next((run, ranks) for run, ranks in stuck if ranks)
        return (f"node {run.node.name} on pool {run.node.pool!r} did not finish within executor.node_timeout_s="
                f"{self.config.options.node_timeout_s:g} s (ranks still running: {ranks}); rerun to resume from the "
                f"last checkpoint")
