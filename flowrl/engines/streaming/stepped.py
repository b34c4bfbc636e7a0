"""SteppedStreamer: a StreamingEngine (flowrl.engines.streaming.protocol) over an engine that steps requests.

A `StepCore` is an engine driven request by request, as vLLM's in-process `LLMEngine` is (`add_request`,
`abort_request`, `step`; flowrl.engines.vllm.streamer.VLLMCore): each `step()` advances every request inside it
by the engine's own scheduling and returns what each produced since (`Delta`). One worker thread
(flowrl.engines.streaming.worker) adds each waiting request, steps while any run and resolves each as its last
delta arrives. An abort (`pause(abort=True)`, a cancelled caller) runs in that thread between two steps: the
tokens delivered so far are the request's prefix, and after `resume(version)` it is added again (a new request
id) with prompt + prefix, the budget left and its seed shifted by its tokens so far (`Job.seed`).

A replica spanning several ranks (tensor parallel) runs one SteppedStreamer on its leader over a
`flowrl.engines.streaming.lockstep.LeaderCore`, which sends every add, abort and step to the followers; `pause`,
`resume` and `close` reach the core too, so it can tell them when to stop listening. A core of one rank ignores
them.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Protocol

from flowrl.engines.protocols import FinishReason, SamplingParams
from flowrl.engines.streaming.worker import Job, StreamWorker

FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}  # vLLM's finish_reason


@dataclass(frozen=True)
class Delta:
    """What one step produced for one request: its new tokens, their logprobs, and its finish reason once done
    ("stop", "length"; anything else is the engine's failure), None while it runs."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    finish: str | None = None


class Refused(Exception):
    """A request that is its own fault (e.g. longer than the model's context): it alone fails, with `error`."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class StepCore(Protocol):
    """An engine stepped request by request; `add` raises Refused for a request that is its own fault."""

    def add(self, request_id: str, prompt: list[int], params: SamplingParams, seed: int | None) -> None: ...

    def abort(self, request_ids: list[str]) -> None: ...

    def step(self) -> list[Delta]: ...

    # The hooks below do nothing unless a core needs them; a core that subclasses StepCore inherits that.
    def idle(self) -> None:
        """Called when no request runs (a leader flushes what it recorded, or beats)."""

    def resume(self) -> None:
        """Called before the first step after a pause."""

    def pause(self) -> None:
        """Called when the streamer pauses (a weight update follows)."""

    def close(self) -> None:
        """Called once, when the streamer stops."""


@dataclass(eq=False)
class _Live:
    """A job added to the core: the version it runs under and the tokens delivered so far."""

    job: Job
    version: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class SteppedStreamer(StreamWorker):
    """Samples requests one by one through a StepCore (see the module docstring); `paused`: start paused (a
    tensor-parallel replica starts on its first `resume`, as its followers do)."""

    def __init__(self, core: StepCore, *, name: str = "SteppedStreamer", version: int = 0, paused: bool = False,
                 start_timeout_s: float = 60.0, pause_timeout_s: float = 600.0, close_timeout_s: float = 60.0):
        self.core = core
        self.live: dict[str, _Live] = {}  # by the core's request id
        self.attempts = itertools.count()
        super().__init__(name=name, version=version, start_timeout_s=start_timeout_s,
                         pause_timeout_s=pause_timeout_s, close_timeout_s=close_timeout_s)
        if paused:
            with self.cond:
                self.paused = True

    async def pause(self, abort: bool = False) -> None:
        await super().pause(abort)
        await asyncio.to_thread(self.core.pause)  # a leader's last message may wait for its followers

    def resume(self, version: int) -> None:
        self.core.resume()
        super().resume(version)

    def work(self) -> None:
        jobs, version = self.take(list, wait=not self.live)
        for job in jobs:
            self._add(job, version)
        self._drop_cancelled()
        if self.live and self.stopping:
            self._abort_live()
        if self.live:
            for delta in self.core.step():
                self._receive(delta)
        else:
            self.core.idle()

    def finish_work(self) -> None:
        """Leaves no request of this streamer inside the core (a later batch generate would step them)."""
        try:
            if self.live:
                self.core.abort(list(self.live))
                self.live.clear()
        finally:
            self.core.close()

    def _add(self, job: Job, version: int) -> None:
        request_id = f"{job.request.id}.{next(self.attempts)}"
        try:
            self.core.add(request_id, job.prompt, job.params(), job.seed)
        except Refused as refused:
            self.fail(job, refused.error)
            return
        self.live[request_id] = _Live(job, version)

    def _receive(self, delta: Delta) -> None:
        live = self.live[delta.request_id]
        live.ids += delta.token_ids
        live.logprobs += delta.logprobs
        if delta.finish is not None:
            del self.live[delta.request_id]
            if delta.finish not in FINISH:
                raise RuntimeError(f"the engine finished request {delta.request_id} with {delta.finish!r}")
            self.settle(live.job, live.ids, live.logprobs, live.version, FINISH[delta.finish])

    def _drop_cancelled(self) -> None:
        """Aborts the requests whose callers gave up (a cancelled `await sample(...)`): the core stops them."""
        gone = [request_id for request_id, live in self.live.items() if live.job.future.done()]
        if gone:
            self.core.abort(gone)
            for request_id in gone:
                self.fail(self.live.pop(request_id).job, asyncio.CancelledError())

    def _abort_live(self) -> None:
        """Cuts every running request where it is: what it sampled so far is its prefix."""
        self.core.abort(list(self.live))
        lives, self.live = list(self.live.values()), {}
        for live in lives:
            self.settle(live.job, live.ids, live.logprobs, live.version, None)
