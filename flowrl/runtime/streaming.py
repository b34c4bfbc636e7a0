"""Streamed rollouts: groups complete as their samples arrive, and a step trains on the first to be ready.

`fl.buffer(batch, max_staleness=k, stream=True)` replaces the step's `rollout.generate` with a
StreamingEngine (flowrl.engines.streaming; `Rollout.streaming_engine`, made by roles.rollout.engine's config)
driven from an asyncio loop in a background thread. Each prompt row drawn becomes n Requests (row r of the
draw seeded with the seed `generate` would give the draw's call, plus r: every sample its own seed, as vLLM's
seeded rows); up to `roles.rollout.max_in_flight` of them sample at once. When all n samples of a prompt are
done, `Rollout.streamed` builds the group's rows (the fields `generate` writes, plus `policy_version_min` /
`policy_version_max` over the tokens' versions; `policy_version` is the min) and the producers after
`generate` (reward.score) run on that group alone, while the other samples keep generating.

Step t (the local executor):

1. syncs the followers (the weights of version v, the source's update count) and resumes the engine at v;
   prompt batches are drawn until (k + 1) x batch_size prompts are drawn but not yet trained;
2. waits for `batch_size` scored groups (deadline roles.rollout.stream_timeout_s, `stream/wait_s`) and takes
   the earliest drawn of those ready; groups still in flight (a long response) go on;
3. pauses the engine: `pause(abort=roles.rollout.partial)`: responses in flight either finish under v, or
   stop and keep their prefix, resuming from it under v + 1 at the next step's resume;
4. drops each sample whose oldest token lags v by more than k (`buffer/dropped`,
   `buffer/staleness/mean|max` over min versions) and runs the consumers (logprobs, advantages, update).
   A group that loses members keeps its survivors (verl drops per sample): its advantage baseline is then the
   survivors' mean.

Why pause while the consumers run: in one process the rollout generates with the actor's own module (the
hybrid engine), which the update changes in place; tokens sampled meanwhile would belong to no version, and
the two would share the CPU or GPU anyway. Between steps the engine stays paused, so evaluation and
checkpoints find it idle. The sampler's logprobs are kept per token, so a response spanning two versions is
corrected token by token (flowrl.rl.correction).

With k = 0 every sample of a step's batch is drawn, generated and trained within the step: the rows equal the
synchronous step's for an engine whose row r of a call seeded s is the sample of one request seeded s + r.
A checkpoint holds no sample in flight: a resumed run with k >= 1 skips the prompts drawn ahead of it.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, Iterator

from tensordict import TensorDict

from flowrl import metrics
from flowrl.data.batch import concat
from flowrl.engines.streaming import Request, Sample, StreamingEngine
from flowrl.errors import PlanError
from flowrl.graph.context import CallInfo, StepCalls
from flowrl.graph.trace import Node
from flowrl.plan.planner import Plan
from flowrl.roles.rollout import Rollout
from flowrl.runtime import buffering
from flowrl.runtime.buffering import STEP_TIME, Run, Split
from flowrl.runtime.scheduling import fill_index


@dataclass
class Group:
    """One prompt's n samples, built into rows once all are done."""

    draw: int  # the index of the prompt batch it was drawn in
    index: int  # its row in that batch
    rows: TensorDict
    aborted: int = 0  # its samples that a pause cut and that resumed from their prefix


def make(plan: Plan, nodes: list[Node], roles: dict[str, Any], versions: Callable[[], dict[str, int]],
         world_size: int = 1) -> "Streamer | None":
    """The local executor's streamer for `plan` (None unless its buffer streams); what cannot stream is one
    PlanError line."""
    s = buffering.split(plan, nodes)
    if s is None or not s.stream:
        return None
    where = f"{plan.algorithm}: fl.buffer(stream=True)"
    first = s.producers[0] if s.producers else None
    if first is None or not isinstance(roles.get(first.role), Rollout) or \
            getattr(type(roles[first.role]), first.method) is not Rollout.generate:
        raise PlanError(f"{where} streams rollout.generate, which must be the first node before it; got "
                        f"{first.name if first else 'none'}")
    if fill_index(s.producers) is not None:
        raise PlanError(f"{where}: a fill before the buffer cannot stream (groups are taken as they finish)")
    if world_size != 1:
        raise PlanError(f"{where} runs in one process; got {world_size} ranks")
    return Streamer(s, roles[first.role], first, versions)


class Streamer:
    """The streamed producers and the step that trains on them (see the module docstring)."""

    def __init__(self, s: Split, rollout: Rollout, generate: Node, versions: Callable[[], dict[str, int]]):
        self.split, self.rollout, self.generate, self.versions = s, rollout, generate, versions
        self.after = s.producers[1:]  # run on each group as it completes
        self.engine: StreamingEngine | None = None
        self.loop = asyncio.new_event_loop()
        self.thread: threading.Thread | None = None
        self.done: queue.Queue[tuple[Group, list[Sample]] | BaseException] = queue.Queue()
        self.ready: list[Group] = []
        self.drawn = self.trained = self.draws = 0  # prompts drawn / taken into a batch; batches drawn
        self.in_flight = 0
        self.slots: asyncio.Semaphore | None = None
        self.running: set[asyncio.Task] = set()
        self.run: Run | None = None  # the executor's way to run nodes, set each step

    def step(self, step: int, prompts: Iterator[TensorDict], run: Run) -> tuple[TensorDict, dict[str, float]]:
        calls = StepCalls(step)
        with metrics.collect() as logged:
            start = time.perf_counter()
            batch = self._step(step, prompts, run, calls)
            metrics.log(STEP_TIME, time.perf_counter() - start)
        return batch, logged

    def _step(self, step: int, prompts: Iterator[TensorDict], run: Run, calls: StepCalls) -> TensorDict:
        s, version = self.split, self.versions().get(self.split.source, 0)
        self.run = run
        if self.thread is None:
            self.thread = threading.Thread(target=self.loop.run_forever, name="flowrl-stream", daemon=True)
            self.thread.start()
            self.engine = self._call(self._make_engine())  # made on the loop: it may bind the loop
        run(s.syncs, TensorDict({}, batch_size=[1]), calls)  # the syncs read no field
        self._call(self._resume(version))
        size = self._draw(prompts)
        waited = time.perf_counter()
        taken = self._take(size)
        metrics.log("stream/wait_s", time.perf_counter() - waited)
        metrics.log("stream/in_flight", self.in_flight)
        self._call(self.engine.pause(abort=self.rollout.partial))
        batch = concat([g.rows for g in taken])
        metrics.log("stream/aborted", sum(g.aborted for g in taken))
        metrics.log("stream/mixed_versions", (batch["policy_version_min"] < batch["policy_version_max"]).sum())
        batch, dropped = buffering.drop_stale(batch, s.version_field, version, s.max_staleness)
        for key, value in dropped.items():
            metrics.log(key, value)
        if batch.batch_size[0] == 0:
            metrics.log("buffer/skipped_step", 1.0)
            return batch
        return run(s.consumers, batch, calls)

    def _draw(self, prompts: Iterator[TensorDict]) -> int:
        """Draws prompt batches until (k + 1) batches' prompts wait untrained and submits their requests at once
        (their groups start together); returns the batch size."""
        size, groups = None, []
        while size is None or self.drawn - self.trained < (self.split.max_staleness + 1) * size:
            batch = next(prompts)
            size = size or batch.batch_size[0]
            groups += self._groups(batch, self.draws)
            self.drawn, self.draws = self.drawn + batch.batch_size[0], self.draws + 1
        self._call(self._start(groups))
        return size

    def _groups(self, batch: TensorDict, draw: int) -> list[tuple[Group, list[Request]]]:
        n = self.generate.kwargs.get("n", 1)
        sampling = {k: v for k, v in self.generate.kwargs.items() if k != "n"}
        rows, requests = self.rollout.requests(batch, CallInfo(draw, 1), n, **sampling)
        return [(Group(draw, i, rows[i * n:(i + 1) * n]), requests[i * n:(i + 1) * n])
                for i in range(batch.batch_size[0])]

    async def _start(self, groups: list[tuple[Group, list[Request]]]) -> None:
        for group, requests in groups:
            task = asyncio.create_task(self._sample_group(group, requests))
            self.running.add(task)  # the loop holds tasks weakly
            task.add_done_callback(self.running.discard)

    async def _sample_group(self, group: Group, requests: list[Any]) -> None:
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.rollout.max_in_flight)

        async def one(request: Any) -> Sample:
            async with self.slots:
                self.in_flight += 1
                try:
                    return await self.engine.sample(request)
                finally:
                    self.in_flight -= 1
        try:
            self.done.put((group, list(await asyncio.gather(*map(one, requests)))))
        except Exception as err:  # the main thread raises it
            self.done.put(err)

    def _take(self, size: int) -> list[Group]:
        """The `size` earliest drawn of the groups ready once `size` are, each scored as it arrived."""
        timeout = self.rollout.stream_timeout_s
        deadline = time.monotonic() + timeout
        while len(self.ready) < size or not self.done.empty():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"stream: {len(self.ready)} of {size} groups ready after "
                                   f"roles.rollout.stream_timeout_s={timeout}s")
            try:
                item = self.done.get(timeout=min(left, 1.0)) if len(self.ready) < size else self.done.get_nowait()
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise item
            self.ready.append(self._score(*item))
        self.ready.sort(key=lambda g: (g.draw, g.index))
        taken, self.ready = self.ready[:size], self.ready[size:]
        self.trained += len(taken)
        return taken

    def _score(self, group: Group, samples: list[Sample]) -> Group:
        """The group's rows, and the producers after generate run on them (as call 1 of its draw's step)."""
        with metrics.node(self.generate.name):
            rows = self.rollout.streamed(group.rows, samples)
        group.rows = self.run(self.after, rows, StepCalls(group.draw)) if self.after else rows
        group.aborted = sum(s.aborts > 0 for s in samples)
        return group

    async def _make_engine(self) -> StreamingEngine:
        return self.rollout.streaming_engine()

    async def _resume(self, version: int) -> None:
        self.engine.resume(version)

    def _call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Runs `coroutine` on the loop, waiting at most roles.rollout.stream_timeout_s."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout=self.rollout.stream_timeout_s)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"stream: the rollout engine did not answer within "
                               f"roles.rollout.stream_timeout_s={self.rollout.stream_timeout_s}s") from None

    def close(self) -> None:
        """Closes the streaming engine, cancels what is still in flight and stops the loop."""
        if self.thread is None:
            return
        if self.engine is not None:
            self.engine.close()
        self._call(_cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=self.rollout.stream_timeout_s)
        self.thread = None
        if not self.loop.is_running():
            self.loop.close()


async def _cancel_all() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
