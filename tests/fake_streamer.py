"""A fake StreamingEngine (flowrl.engines.streaming.protocol) for streamed-rollout tests: deterministic, no thread.

Each request's response is what the batch engine gives for that one row under the request's seed, handed out
one token at a time (an await between tokens). `stall(i)` scripts the i-th request to arrive (0-based): None
runs straight through; (at, times) stops before token `at` until a pause, `times` times: a pause(abort=False)
lets it finish under the old version, a pause(abort=True) cuts it there (its prefix kept, `aborts` counted)
and it continues after the resume. Token j's logprob is the batch engine's minus `per_version` x the version
that sampled it, so a test sees which weights sampled each token.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import torch

from flowrl.engines.protocols import FinishReason
from flowrl.engines.streaming.protocol import Request, Sample

Stall = Callable[[int], "tuple[int, int] | None"]


class FakeStreamer:
    def __init__(self, engine, stall: Stall = lambda i: None, per_version: float = 0.0):
        self.engine, self.stall, self.per_version = engine, stall, per_version
        self.version, self.arrived, self.in_flight = 0, 0, 0
        self.open, self.abort = True, False
        self.pauses: list[bool] = []  # each pause's abort
        self.closed = False
        self._paused: asyncio.Event | None = None  # set from a pause until the resume
        self._resumed: asyncio.Event | None = None

    def _events(self) -> tuple[asyncio.Event, asyncio.Event]:
        if self._paused is None:
            self._paused, self._resumed = asyncio.Event(), asyncio.Event()
            self._resumed.set()
        return self._paused, self._resumed

    async def sample(self, request: Request) -> Sample:
        paused, resumed = self._events()
        index, self.arrived = self.arrived, self.arrived + 1
        full_ids, full_logprobs, finish = self._response(request)
        at, times = self.stall(index) or (len(full_ids), 0)
        ids, logprobs, versions, aborts = [], [], [], 0
        while True:
            await resumed.wait()
            self.in_flight += 1
            try:
                cut = False
                while len(ids) < len(full_ids):
                    if len(ids) == at and times:
                        await paused.wait()
                        times, cut = times - 1, self.abort
                        if cut:
                            break
                    await asyncio.sleep(0)
                    ids.append(full_ids[len(ids)])
                    logprobs.append(full_logprobs[len(logprobs)] - self.per_version * self.version)
                    versions.append(self.version)
            finally:
                self.in_flight -= 1
            if not cut:
                return Sample(request, ids, logprobs, versions, finish, aborts)
            aborts += 1

    def _response(self, request: Request) -> tuple[list[int], list[float], FinishReason]:
        prompt = torch.tensor([request.prompt_ids])
        out = self.engine.generate(prompt, torch.ones_like(prompt), request.params, seed=request.seed)
        length = int(out["response_mask"][0].sum())
        return (out["response_ids"][0, :length].tolist(), out["rollout_logprobs"][0, :length].tolist(),
                FinishReason(int(out["finish_reason"][0])))

    async def pause(self, abort: bool = False) -> None:
        paused, resumed = self._events()
        self.pauses.append(abort)
        self.abort = abort
        resumed.clear()
        paused.set()
        for _ in range(10_000):
            if not self.in_flight:
                return
            await asyncio.sleep(0.001)
        raise TimeoutError("FakeStreamer: requests still in flight 10 s after a pause")

    def resume(self, version: int) -> None:
        paused, resumed = self._events()
        self.version, self.abort = version, False
        paused.clear()
        resumed.set()

    def close(self) -> None:
        self.closed = True


def unpadded(engine, rows, params):
    """A batch engine's responses to unpadded prompt `rows`, each unpadded: [(ids, logprobs, finish)]."""
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    out = engine.generate(ids, mask, params)
    lengths = out["response_mask"].sum(-1).tolist()
    return [(row[:n], lp[:n], FinishReason(f)) for row, lp, n, f in zip(
        out["response_ids"].tolist(), out["rollout_logprobs"].tolist(), lengths, out["finish_reason"].tolist())]
