"""Bounded staleness at run time: the producers before `fl.buffer` run ahead of the consumers after it.

`fl.buffer(batch, max_staleness=k)` splits a step's nodes into producers (the
weight syncs, generation, scoring) and consumers (logprobs, update). With
k = 0 the buffer is a pass-through and the step is the synchronous one,
unchanged. With k >= 1 the executor holds a `Pipeline`: the batches of the
next k steps. Step t:

1. takes step t's batch, produced during step t-k (the first step produces
   steps 0..k at once, all with the initial weights);
2. runs the producers of step t+k: first the followers' weight syncs (step
   t-1's update has finished, so the rollout loads the weights of version t),
   then generation and scoring of the next prompts, seeded as step t+k;
3. drops the rows of step t's batch whose version (the buffer node's read,
   `policy_version`) lags the weight source's update count by more than k,
   counted in `buffer/dropped`, and runs the consumers on the rest (none
   left: `buffer/skipped_step`).

With one update per step, step t trains the weights of version t on rows
sampled with version max(0, t-k): staleness min(t, k). The versions count the
source's updates, so a step that updates twice ages its rows twice as fast.

Where the producers touch no pool and no driver role the consumers touch,
change no weights and do not fill (the Ray executor with the rollout on its
own pool), step 2 runs in a thread beside step 3: generation of step t+k
overlaps training of step t, and the step takes the longer of the two.
Otherwise (the local executor, shared pools) the producers run first, then
the consumers, with the same result. Both finish within the step, so between
steps (evaluation, checkpoints, export) nothing runs.

Metrics: a batch's producer metrics (reward, response length, generation
timing, `timing_s/produce`) are logged with the step that trains on it, with
`buffer/staleness/mean|max` and `buffer/dropped`; `timing_s/step` is the whole
step.

Checkpoints save the buffered batches and their metrics (entry `BUFFER` of the
executor's train_engines, one file holding every rank's), so a resumed run
trains on exactly the rows the uninterrupted one would. Resuming sets the
versions one past the saved counts (so the followers resync); the restored
rows' versions are shifted by the same amount, keeping their staleness.
"""

from __future__ import annotations

import pickle
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from tensordict import NonTensorStack, TensorDict

from flowrl.errors import PlanError
from flowrl.graph.context import StepCalls
from flowrl.graph.trace import Node, NodeKind
from flowrl.plan.placement import DRIVER
from flowrl.plan.planner import Plan
from flowrl.runtime.scheduling import ONE, Spread, fill_index, run_step, scheduled

BUFFER = "_buffer"  # the checkpoint folder of the buffered batches (no role is named so)
_FILE = "buffer.pt"
STEP_TIME, PRODUCE_TIME = "timing_s/step", "timing_s/produce"

Run = Callable[[list[Node], TensorDict, StepCalls], TensorDict]


@dataclass(frozen=True)
class Split:
    """A plan's step split at its buffer node."""

    syncs: list[Node]  # the followers' weight syncs before the buffer
    producers: list[Node]  # the other nodes before it
    consumers: list[Node]  # the nodes after it
    max_staleness: int
    version_field: str  # the rows' version: what the buffer node reads
    source: str  # the role whose update count the versions are
    stream: bool = False  # fl.buffer(stream=True): flowrl.runtime.offpolicy.streaming runs it


@dataclass
class Produced:
    step: int  # the step that trains on it
    batch: TensorDict
    logged: dict[str, float]


def split(plan: Plan, nodes: list[Node]) -> Split | None:
    """The split at the plan's buffer node (`nodes` in schedule order), or None without one or with k = 0 (and
    no stream)."""
    at = next((i for i, node in enumerate(nodes) if node.kind is NodeKind.BUFFER), None)
    if at is None or not (nodes[at].kwargs.get("max_staleness", 0) or nodes[at].kwargs.get("stream", False)):
        return None
    node, before = nodes[at], nodes[:at]
    (version_field,) = node.reads
    sources = {plan.specs[n.role].weights_from for n in before if n.role in plan.specs and version_field in n.writes}
    if len(sources - {None}) != 1:
        raise PlanError(f"{plan.algorithm}: {node.name} counts staleness in {version_field!r}, which one role "
                        f"following another's weights must write before it; writers follow {sorted(map(str, sources))}")
    return Split(syncs=[n for n in before if n.kind is NodeKind.SYNC],
                 producers=[n for n in before if n.kind is not NodeKind.SYNC], consumers=nodes[at + 1:],
                 max_staleness=node.kwargs.get("max_staleness", 0), version_field=version_field,
                 source=(sources - {None}).pop(), stream=node.kwargs.get("stream", False))


def can_overlap(plan: Plan, s: Split) -> bool:
    """Producers may run beside the consumers: no pool or driver role in common, no weight change, no fill."""
    def touched(nodes: list[Node]) -> set[tuple[str, str | None]]:
        return {(n.pool, n.role if n.pool == DRIVER else None) for n in nodes if n.role is not None}

    updates = any(plan.specs[n.role].methods()[n.method].updates_weights for n in s.producers if n.role in plan.specs)
    return not updates and fill_index(s.producers) is None and not touched(s.producers) & touched(s.consumers)


def drop_stale(batch: TensorDict, version_field: str, version: int,
               max_staleness: int) -> tuple[TensorDict, dict[str, float]]:
    """The rows at most `max_staleness` versions behind `version`, each with `trained_version` (= `version`: the
    weights it trains), and the buffer's metrics: `buffer/rows_staleness_<s>` counts the kept rows s versions
    behind, for s = 0..max_staleness.

        versions [0, 1, 2, 3] at version 3, k = 1 -> rows 2 and 3 kept; dropped 2, staleness mean 1.5, max 3,
        rows_staleness_0 = 1 (row 3), rows_staleness_1 = 1 (row 2)
    """
    staleness_B = version - batch[version_field]
    keep_B = staleness_B <= max_staleness
    logged = {"buffer/dropped": float((~keep_B).sum())}
    if staleness_B.numel():
        logged.update({"buffer/staleness/mean": staleness_B.float().mean().item(),
                       "buffer/staleness/max": float(staleness_B.max())})
    for s in range(max_staleness + 1):
        logged[f"buffer/rows_staleness_{s}"] = float((staleness_B == s).sum())
    kept = batch.copy() if keep_B.all() else batch[keep_B]  # the caller's batch stays as it was
    kept["trained_version"] = torch.full_like(kept[version_field], version)
    return kept, logged


class Pipeline:
    """The batches of the coming steps and the step that keeps them coming (see the module docstring)."""

    def __init__(self, s: Split, versions: Callable[[], dict[str, int]], overlap: bool, spread: Spread = ONE):
        self.split, self.versions, self.overlap, self.spread = s, versions, overlap, spread
        self.queue: deque[Produced] = deque()
        self._saved_version: int | None = None  # the source's version when a restored queue was saved

    def step(self, step: int, prompts: Iterator[TensorDict], run: Run) -> tuple[TensorDict, dict[str, float]]:
        """Step `step`: produce up to step + k, train on this step's batch; `run(nodes, batch, calls)` is the
        executor's way to run nodes."""
        start = time.perf_counter()
        self._shift_restored()
        if not self.queue or self.queue[0].step != step:  # the first step: its own batch first
            self.queue = deque([self._produce(step, prompts, run)])
        head = self.queue.popleft()
        ahead = list(range((self.queue[-1].step if self.queue else step) + 1, step + self.split.max_staleness + 1))
        if self.overlap and ahead:
            synced, sync_logged = self._sync(ahead, prompts, run)
            with ThreadPoolExecutor(1, thread_name_prefix="flowrl-producers") as pool:
                produced = pool.submit(lambda: [self._produce(j, iter([b]), run, syncs=False) for j, b in synced])
                batch, logged = self._consume(head, run)
                self.queue.extend(produced.result())
            self.queue[-len(ahead)].logged.update(sync_logged)
        else:
            self.queue.extend(self._produce(j, prompts, run) for j in ahead)
            batch, logged = self._consume(head, run)
        return batch, {**logged, STEP_TIME: time.perf_counter() - start}

    def _produce(self, step: int, prompts: Iterator[TensorDict], run: Run, syncs: bool = True) -> Produced:
        nodes = [*self.split.syncs, *self.split.producers] if syncs else self.split.producers
        batch, logged = run_step(step, nodes, fill_index(nodes), run, prompts, self.spread)
        logged[PRODUCE_TIME] = logged.pop(STEP_TIME)
        return Produced(step, batch, logged)

    def _sync(self, steps: list[int], prompts: Iterator[TensorDict],
              run: Run) -> tuple[list[tuple[int, TensorDict]], dict[str, float]]:
        """The followers' syncs, run here before the producers start beside the consumers (so nothing else
        touches the weight source meanwhile), and their metrics; the producers' prompts are drawn here too."""
        batches = [(j, next(prompts)) for j in steps]
        _, logged = run_step(steps[0], self.split.syncs, None, run, iter([batches[0][1]]))
        logged.pop(STEP_TIME)
        return batches, logged

    def _consume(self, head: Produced, run: Run) -> tuple[TensorDict, dict[str, float]]:
        s = self.split
        version = self.versions().get(s.source, 0)
        batch, logged = drop_stale(head.batch, s.version_field, version, s.max_staleness)
        logged = {**head.logged, **logged}
        if batch.batch_size[0] == 0:
            return batch, {**logged, "buffer/skipped_step": 1.0}
        batch, consumed = run_step(head.step, s.consumers, None, run, iter([batch]))
        return batch, {**logged, **consumed}

    def _shift_restored(self) -> None:
        """Restored rows: their versions move with the source's (resume sets it one past the saved count)."""
        if self._saved_version is None:
            return
        offset = self.versions().get(self.split.source, 0) - self._saved_version
        for item in self.queue:
            item.batch[self.split.version_field] = item.batch[self.split.version_field] + offset
        self._saved_version = None

    def save(self, path: str) -> None:
        """Every rank's queue into one file (collective under torchrun; rank 0 writes): tensors, lists and
        numbers only, so loading it unpickles no object (torch.load's weights_only)."""
        mine = {"version": self.versions().get(self.split.source, 0),
                "queue": [_plain(p) for p in self.queue]}
        ranks = _gather(mine)
        if not dist.is_initialized() or dist.get_rank() == 0:
            Path(path).mkdir(parents=True, exist_ok=True)
            torch.save(ranks, Path(path) / _FILE)

    def load(self, path: str) -> None:
        ranks = load_plain(Path(path) / _FILE, "a buffer")
        mine = ranks[dist.get_rank() if dist.is_initialized() else 0]
        self.queue = deque(_produced(item) for item in mine["queue"])
        self._saved_version = mine["version"]


def make(plan: Plan, nodes: list[Node], versions: Callable[[], dict[str, int]], overlap: bool,
         spread: Spread = ONE) -> Pipeline | None:
    """The executor's pipeline for `plan` (None: no buffer, k = 0, or a streaming buffer, which
    flowrl.runtime.offpolicy.streaming runs); `overlap`: the executor can run the producers beside the consumers where the
    plan allows it; `spread`: the rows' ranks, for a fill."""
    s = split(plan, nodes)
    return None if s is None or s.stream else Pipeline(s, versions, overlap and can_overlap(plan, s), spread)


def refuse_stream(plan: Plan, s: Split | None = None) -> None:
    """What the Ray executor calls before it starts anything: it streams a buffer only from a streamed role
    alone on a pool, each rank a replica (flowrl.runtime.ray.streaming); anything else is one line."""
    s = split(plan, scheduled(plan)) if s is None else s
    if s is None or not s.stream or not s.producers:
        return
    where, role = f"{plan.algorithm}: fl.buffer(stream=True) on the Ray executor", s.producers[0].role
    pool = plan.pools.get(role)
    if pool is None:
        raise PlanError(f"{where} streams from a role on a pool; {s.producers[0].name} runs on the driver")
    shared = sorted({n.role for n in s.consumers if n.role in plan.pools and plan.pools[n.role].name == pool.name})
    if shared:
        raise PlanError(f"{where} needs {role} on a pool of its own (split placement; or executor.name=local): "
                        f"pool {pool.name!r} also hosts {', '.join(shared)}")


def checkpointed(engines: dict[str, Any], pipeline: Any | None) -> dict[str, Any]:
    """What a checkpoint saves and loads: the train engines, and the buffered batches (a Pipeline) or the
    drawn but untrained prompts (a streamed buffer's Streamer) when there are any."""
    return engines if pipeline is None else {**engines, BUFFER: pipeline}


def load_plain(file: Path, what: str):
    """A checkpoint file of tensors and plain values (a run folder is data, never code: nothing else is
    unpickled); anything else is one ValueError line."""
    try:
        return torch.load(file, weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"{file}: not {what} of tensors and plain values; refused "
                         f"({str(err).splitlines()[0]})") from None


def plain_batch(batch: TensorDict) -> dict[str, Any]:
    """A batch as tensors and lists (its metadata columns: NonTensorStacks), for torch.load's weights_only."""
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    columns = {k: list(batch.get(k).tolist()) for k in batch.keys() if k not in tensors}
    return {"tensors": tensors, "columns": columns, "rows": batch.batch_size[0]}


def from_plain(item: dict[str, Any]) -> TensorDict:
    """The batch `plain_batch` gave `item`."""
    batch = TensorDict(item["tensors"], batch_size=[item["rows"]])
    for key, values in item["columns"].items():
        batch[key] = NonTensorStack(*values)
    return batch


def _plain(p: Produced) -> dict[str, Any]:
    """A buffered batch as `plain_batch` with its step and metrics."""
    return {"step": p.step, **plain_batch(p.batch), "logged": p.logged}


def _produced(item: dict[str, Any]) -> Produced:
    return Produced(item["step"], from_plain(item), item["logged"])


def _gather(obj: Any) -> list[Any]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
