"""The Ray executor: a compiled plan over one Ray actor (`PoolWorker`) per rank of each pool.

- Each pool's workers build only that pool's roles; a pool of several ranks is
  its own torch.distributed group (gloo on CPU, NCCL on CUDA, rendezvous on a
  driver-chosen port of 127.0.0.1, so one host), and its train engines shard
  with FSDP2 over it. Stage nodes and the reward run on the driver.
- A role node splits the batch's rows evenly over its pool's ranks (generate
  splits prompts, so a prompt's samples stay on one rank) and the results are
  concatenated. Nodes start as soon as nothing unfinished before them blocks
  them (a field they read or write, or a row change), so independent nodes
  (actor, ref and critic forwards) run at once on their pools; the driver
  waits only for what it needs next. Worker metrics come back per call and
  are averaged over the pool's ranks.
- Weight sync across pools: every actor rank gathers the full state dict
  (collective under FSDP) and rank 0's ObjectRef goes to every rollout rank.
- Workers ask Ray for `WORKER_NUM_CPUS` CPUs (0: they fit on any machine,
  however many pools) and one GPU each on CUDA pools.
"""

from __future__ import annotations

import copy
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import ray
from tensordict import TensorDict

from flowrl import metrics
from flowrl.batch import concat
from flowrl.build import build_subset
from flowrl.config import RunConfig
from flowrl.distributed import average
from flowrl.errors import PlanError
from flowrl.executor import TRAINABLE_ROLES, call_node, fill_index, run_with_fill
from flowrl.planner import DRIVER, Plan, Pool
from flowrl.ray_worker import Builder, PoolWorker
from flowrl.trace import Node

WORKER_NUM_CPUS = 0  # Ray CPUs reserved per worker; torch still uses OMP_NUM_THREADS (Ray sets 1) threads
_EMPTY = TensorDict({}, batch_size=[0])


def init_ray() -> None:
    """Start (or join, with RAY_ADDRESS) a Ray cluster unless this process already did."""
    if not ray.is_initialized():
        ray.init(include_dashboard=False)


@dataclass
class _Versions:
    """Actor updates dispatched, and the update count the rollout pool last loaded (split pools)."""

    actor: int = 0
    synced: int = 0


@dataclass
class _Launched:
    node: Node
    batches: list[ray.ObjectRef]  # one per rank (for a cross-pool sync: the load_weights calls)
    logged: list[ray.ObjectRef]  # one metrics dict per rank
    start: float


@dataclass(frozen=True)
class PoolEngine:
    """One trainable role across its pool's ranks, for flowrl.checkpoint: save and load call every rank."""

    workers: tuple[Any, ...]
    role: str

    def save(self, path: str) -> None:
        ray.get([w.save.remote(self.role, path) for w in self.workers])

    def load(self, path: str) -> None:
        ray.get([w.load.remote(self.role, path) for w in self.workers])


class RayExecutor:
    def __init__(self, plan: Plan, cfg: RunConfig, task: Any, model_path: Path, builder: Builder = build_subset):
        """`builder(cfg, roles, shares_actor_module, task, path)` builds a pool's roles in its workers (task None)
        and the reward on the driver; tests pass one that builds fakes."""
        self.plan = plan
        self.fill_at = _checked_fill(plan)
        pools = {pool.name: pool for pool in plan.pools.values()}
        configs = {name: _pool_config(cfg, pool) for name, pool in pools.items()}
        self.driver_roles = builder(cfg, ("reward",), False, task, model_path)
        self.workers: dict[str, list[Any]] = {}
        setups = []
        for name, pool in pools.items():
            roles = tuple(r for r, p in plan.pools.items() if p.name == name)
            self.workers[name], started = _start_pool(pool, configs[name], roles, plan.shares_actor_module(),
                                                      model_path, builder)
            setups += started
        try:
            ray.get(setups)
        except BaseException:
            self.close()
            raise
        self.sync_pools = tuple(plan.pools[r].name if r in plan.pools else None for r in ("actor", "rollout"))
        self.versions = _Versions()

    def run_step(self, step: int, prompts: Iterator[TensorDict]) -> tuple[TensorDict, dict[str, float]]:
        """One training step over prompt batches drawn from `prompts`; returns the batch and metrics."""
        if "rollout" in self.plan.pools:
            for worker in self._workers_of("rollout"):
                worker.begin_step.remote(step)  # runs before this step's calls: Ray keeps a caller's order
        with metrics.collect() as logged:
            start = time.perf_counter()
            batch = run_with_fill(self.plan.nodes, self.fill_at, self._run, prompts)
            metrics.log("timing_s/step", time.perf_counter() - start)
        return batch, logged

    def for_plan(self, plan: Plan) -> "RayExecutor":
        """A view running `plan` (e.g. the evaluation) on these workers; its pools must be among them."""
        for role, pool in plan.pools.items():
            mine = self.plan.pools.get(role)
            if mine is None or (mine.name, mine.world_size) != (pool.name, pool.world_size):
                raise PlanError(f"executor: plan {plan.algorithm} puts role {role!r} on pool {pool.name!r}, "
                                f"which these workers do not host")
        view = copy.copy(self)
        view.plan, view.fill_at = plan, _checked_fill(plan)
        return view

    def call(self, role: str, method: str, batch: TensorDict, **kwargs: Any) -> TensorDict:
        """role.method(shard, **kwargs) on every rank of the role's pool, the rows split evenly; rows concatenated."""
        if role not in self.plan.pools:
            raise ValueError(f"role {role!r} is on no pool of plan {self.plan.algorithm}; pools host "
                             f"{sorted(self.plan.pools)}")
        node = Node(name=f"{role}.{method}", kind="rows", reads=frozenset(), writes=frozenset(), kwargs=kwargs,
                    role=role, method=method, pool=self.plan.pools[role].name)
        return self._resolve([self._launch(node, batch)], batch)

    def train_engines(self) -> dict[str, PoolEngine]:
        return {r: PoolEngine(tuple(self._workers_of(r)), r) for r in TRAINABLE_ROLES if r in self.plan.pools}

    @property
    def actor_version(self) -> int:
        return self.versions.actor

    @actor_version.setter
    def actor_version(self, version: int) -> None:
        """Set on resume (one past the saved count), so the first step syncs the rollout to the loaded actor."""
        self.versions.actor = version
        ray.get([w.set_actor_version.remote(version) for w in self._workers_of("actor")])

    def save_pretrained(self, path: str, tokenizer: Any = None) -> None:
        """The actor as a Hugging Face folder (every actor rank gathers; rank 0 writes)."""
        tokenizer_ref = ray.put(tokenizer)
        ray.get([w.save_pretrained.remote(path, tokenizer_ref) for w in self._workers_of("actor")])

    def close(self) -> None:
        """Ends the workers (of every view: close only the executor you built)."""
        for workers in self.workers.values():
            for worker in workers:
                ray.kill(worker)
        self.workers = {}

    def _workers_of(self, role: str) -> list[Any]:
        return self.workers[self.plan.pools[role].name]

    def _run(self, nodes: list[Node], batch: TensorDict) -> TensorDict:
        """Start every node nothing unfinished blocks, remote ones first; wait only when nothing can start."""
        todo, inflight = list(nodes), []
        while todo or inflight:
            node = _next_startable(todo, inflight)
            if node is None:
                needed = [run for run in inflight if not todo or _blocks(run.node, todo[0])]
                inflight = [run for run in inflight if run not in needed]
                batch = self._resolve(needed, batch)
            elif node.pool == DRIVER:
                todo.remove(node)
                start = time.perf_counter()
                batch = call_node(node, self.driver_roles, batch)
                metrics.log(f"timing_s/{node.name}", time.perf_counter() - start)
            else:
                todo.remove(node)
                inflight.append(self._launch(node, batch))
            if batch.batch_size[0] == 0 and todo and not inflight:
                return batch
        return batch

    def _launch(self, node: Node, batch: TensorDict) -> _Launched:
        start = time.perf_counter()
        if node.kind == "sync":
            return self._launch_sync(node, start)
        workers = self.workers[node.pool]
        shards = [ray.put(shard) for shard in _split(batch, node, len(workers))]
        keep = None if node.kind == "rows" else tuple(sorted(node.writes))
        calls = [w.call.remote(node.role, node.method, shard, node.kwargs, keep) for w, shard in zip(workers, shards)]
        if (node.role, node.method) == ("actor", "update"):
            self.versions.actor += 1
        return _Launched(node, [b for b, _ in calls], [m for _, m in calls], start)

    def _launch_sync(self, node: Node, start: float) -> _Launched:
        """Same pool: the workers' own Rollout.sync_weights. Split pools: rank 0's full state into every rollout
        rank, only when the actor has been updated since the last sync."""
        actor, rollout = self.sync_pools
        if actor is None or actor == rollout:
            calls = [w.call.remote(node.role, node.method, _EMPTY, node.kwargs, ()) for w in self.workers[node.pool]]
            return _Launched(node, [b for b, _ in calls], [m for _, m in calls], start)
        if self.versions.synced == self.versions.actor:
            return _Launched(node, [], [], start)
        states = [w.full_state_dict.remote() for w in self.workers[actor]]  # collective: every rank gathers
        loaded = [w.load_weights.remote(states[0]) for w in self.workers[rollout]]
        self.versions.synced = self.versions.actor
        return _Launched(node, loaded, [], start)

    def _resolve(self, done: list[_Launched], batch: TensorDict) -> TensorDict:
        """Wait for `done` (one ray.get) and merge their results into the batch in trace order."""
        values = iter(ray.get([ref for run in done for ref in (*run.batches, *run.logged)]))
        for launched in done:
            outs = [next(values) for _ in launched.batches]
            for name, value in average([next(values) for _ in launched.logged]).items():
                metrics.log(name, value)
            metrics.log(f"timing_s/{launched.node.name}", time.perf_counter() - launched.start)
            batch = _merge(launched.node, outs, batch)
        return batch


def _merge(node: Node, outs: list[Any], batch: TensorDict) -> TensorDict:
    if node.kind == "rows":
        return concat(outs)
    if node.kind == "map" and node.writes:
        written = concat(outs)
        for key in sorted(node.writes):
            batch[key] = written[key]
    return batch


def _blocks(earlier: Node, node: Node) -> bool:
    """Whether `node` must wait for the unfinished `earlier` one: it reads what earlier writes (the graph's edge),
    writes what earlier reads or writes, or either changes rows (or is a fill or a sync)."""
    if earlier.kind != "map" or node.kind != "map":
        return True
    return bool(node.reads & earlier.writes or node.writes & (earlier.reads | earlier.writes))


def _next_startable(todo: list[Node], inflight: list[_Launched]) -> Node | None:
    """The first node (a remote one before any on the driver) that nothing unfinished before it blocks."""
    startable = [node for i, node in enumerate(todo)
                 if not any(_blocks(earlier, node) for earlier in [*(run.node for run in inflight), *todo[:i]])]
    remote = [node for node in startable if node.pool != DRIVER]
    return (remote or startable or [None])[0]


def _split(batch: TensorDict, node: Node, num_ranks: int) -> list[TensorDict]:
    rows = batch.batch_size[0]
    if rows % num_ranks:
        raise ValueError(f"pool {node.pool!r}: {node.name} got {rows} rows, which do not split evenly over its "
                         f"world_size {num_ranks}; make train.batch_size (and train.eval_prompts) a multiple of it")
    size = rows // num_ranks
    return [batch[rank * size:(rank + 1) * size] for rank in range(num_ranks)]


def _checked_fill(plan: Plan) -> int | None:
    fill_at = fill_index(plan)
    wide = [pool.name for pool in plan.pools.values() if pool.world_size > 1]
    if fill_at is not None and wide:
        raise PlanError(f"{plan.algorithm}: dynamic sampling (fill) leaves ranks with unequal rows, which FSDP "
                        f"cannot step together; give pool {wide[0]!r} world_size 1")
    return fill_at


def _pool_config(cfg: RunConfig, pool: Pool) -> RunConfig:
    """The config a pool's workers build from: its device, and its share of the (global) batch sizes."""
    t = cfg.train
    for name in ("mini_batch_size", "micro_batch_size"):
        if getattr(t, name) % pool.world_size:
            raise ValueError(f"train.{name}={getattr(t, name)} must be divisible by the world_size "
                             f"{pool.world_size} of pool {pool.name!r}")
    shares = {name: getattr(t, name) // pool.world_size for name in ("mini_batch_size", "micro_batch_size")}
    return cfg.model_copy(update={"train": t.model_copy(update={**shares, "device": pool.device})})


def _start_pool(pool: Pool, cfg: RunConfig, roles: tuple[str, ...], shares_actor_module: bool, path: Path,
                builder: Builder) -> tuple[list[Any], list[ray.ObjectRef]]:
    """The pool's workers and their setup calls (in flight: the ranks rendezvous with each other)."""
    options = dict(num_cpus=WORKER_NUM_CPUS, num_gpus=1 if pool.device == "cuda" else 0)
    workers = [ray.remote(PoolWorker).options(**options).remote() for _ in range(pool.world_size)]
    address = f"tcp://127.0.0.1:{_free_port()}"
    setups = [w.setup.remote(cfg, roles, shares_actor_module, path, builder, rank, pool.world_size, address)
              for rank, w in enumerate(workers)]
    return workers, setups


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
