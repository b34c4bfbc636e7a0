"""StreamRunner: the rollout side of a streamed rollout (flowrl.runtime.offpolicy.streaming), where the engine lives.

It holds the rollout role's StreamingEngine (`Rollout.streaming_engine`) and an asyncio loop in a thread of its
own that drives it: `submit` turns a prompt batch into one Request per sample (`Rollout.requests`) and starts
each prompt's group as a task, at most `roles.rollout.max_in_flight` samples sampling at once; a group whose n
samples are done waits in a queue. `finished(wanted, timeout_s)` returns every group done so far, its rows built
(`Rollout.streamed`, with the metrics that logged), waiting up to `timeout_s` until `wanted` are; `pause` and
`resume` pass through to the engine, on its loop.

The local executor holds one in its own process; the Ray executor asks the rollout pool's worker to hold it
(`PoolWorker.stream`, flowrl.runtime.ray.streaming), so the engine keeps sampling in that process while the
driver runs the consumers on the train pool: one remote call per take, never one per sample.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Coroutine

from tensordict import TensorDict

from flowrl import metrics
from flowrl.engines.streaming.protocol import Request, Sample, StreamingEngine
from flowrl.graph.context import CallInfo
from flowrl.roles.rollout import Rollout


@dataclass
class Group:
    """One prompt's n samples, built into rows once all are done."""

    draw: int  # the index of the prompt batch it was drawn in
    index: int  # its row in that batch
    rows: TensorDict
    aborted: int = 0  # its samples that a pause cut and that resumed from their prefix
    logged: dict[str, float] = field(default_factory=dict)  # what building its rows logged
    scored: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # its metrics (metrics.record)


class StreamRunner:
    """The engine's loop and the groups in flight (see the module docstring)."""

    def __init__(self, rollout: Rollout):
        self.rollout = rollout
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="flowrl-stream", daemon=True)
        self.thread.start()
        self.engine: StreamingEngine = self._call(self._make_engine())  # made on the loop: it may bind the loop
        self.done: queue.Queue[tuple[Group, list[Sample]] | BaseException] = queue.Queue()
        self.in_flight = 0
        self.slots: asyncio.Semaphore | None = None
        self.running: set[asyncio.Task] = set()

    def settings(self) -> tuple[bool, float, int]:
        """roles.rollout.partial, roles.rollout.stream_timeout_s and the pad token, for the driver."""
        return self.rollout.partial, self.rollout.stream_timeout_s, self.rollout.pad_id

    def submit(self, batch: TensorDict, draw: int, n: int, sampling: dict[str, Any],
               rows: list[int] | None = None) -> None:
        """Starts the n samples of each prompt of draw `draw` (seeded as call 1 of step `draw`); `rows`: of
        those prompts only (a resumed run's untrained ones, seeded as when first drawn)."""
        out, requests = self.rollout.requests(batch, CallInfo(draw, 1), n, **sampling)
        groups = [(Group(draw, i, out[i * n:(i + 1) * n]), requests[i * n:(i + 1) * n])
                  for i in (range(batch.batch_size[0]) if rows is None else rows)]
        self._call(self._start(groups))

    def finished(self, wanted: int, timeout_s: float) -> tuple[list[Group], int]:
        """Every group done so far, waiting up to `timeout_s` until `wanted` are, and the samples in flight."""
        deadline, out = time.monotonic() + timeout_s, []
        while True:
            left = deadline - time.monotonic()
            try:
                item = self.done.get(timeout=left) if len(out) < wanted and left > 0 else self.done.get_nowait()
            except queue.Empty:
                return out, self.in_flight
            if isinstance(item, BaseException):
                raise item
            out.append(self._build(*item))

    def pause(self, abort: bool) -> int:
        """Pauses the engine (`abort`: cut what runs, see flowrl.engines.streaming.protocol); returns the groups that
        finished since the last `finished` (those done while the consumers ran, where they run beside it)."""
        ready = self.done.qsize()
        self._call(self.engine.pause(abort=abort))
        return ready

    def resume(self, version: int) -> None:
        self._call(self._resume(version))

    def close(self) -> None:
        """Closes the streaming engine, cancels what is still in flight and stops the loop."""
        self.engine.close()
        self._call(_cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=self.rollout.stream_timeout_s)
        if not self.loop.is_running():
            self.loop.close()

    def _build(self, group: Group, samples: list[Sample]) -> Group:
        with metrics.collect() as logged:
            group.rows = self.rollout.streamed(group.rows, samples)
        group.aborted, group.logged = sum(s.aborts > 0 for s in samples), logged
        return group

    async def _start(self, groups: list[tuple[Group, list[Request]]]) -> None:
        for group, requests in groups:
            task = asyncio.create_task(self._sample_group(group, requests))
            self.running.add(task)  # the loop holds tasks weakly
            task.add_done_callback(self.running.discard)

    async def _sample_group(self, group: Group, requests: list[Request]) -> None:
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.rollout.max_in_flight)

        async def one(request: Request) -> Sample:
            async with self.slots:
                self.in_flight += 1
                try:
                    return await self.engine.sample(request)
                finally:
                    self.in_flight -= 1
        try:
            self.done.put((group, list(await asyncio.gather(*map(one, requests)))))
        except Exception as err:  # the caller of `finished` raises it
            self.done.put(err)

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


async def _cancel_all() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
