"""ThreadedStreamer: a StreamingEngine (flowrl.engines.streaming.protocol) over any batch RolloutEngine, through one thread.

The worker thread (flowrl.engines.streaming.worker) gathers the waiting requests into one left-padded
`engine.generate` call: the oldest waiting request and up to `max_batch - 1` others sampled the same way (the same
SamplingParams but for max_new_tokens), generated to the largest token budget among them;
each row is cut to its own budget (the first b tokens of a longer response are what a call with
max_new_tokens=b samples). Each request's future resolves on its event loop as its batch returns. Every token
records `version` as it was when its batch started.

`chunk_tokens` (None: off) bounds one call's tokens: rows not finished after a chunk continue in a later call
(prompt + response so far, the budget left) together with requests that came meanwhile, so a short response
resolves without waiting for the batch's longest, at the cost of one prefill per chunk.

Abort (`pause(abort=True)`) with an `Interruptible` engine (HFRolloutEngine: its `stop` event, honoured through a
transformers StoppingCriteria) cuts the running generate after its current step; each row keeps its prefix and
resumes after `resume(version)` from prompt + prefix with the budget left (`Sample.aborts` counts it). An engine
without the hook finishes its batch: abort degrades to finishing the requests in flight under the old weights
(with `chunk_tokens`, unfinished rows still stop at the chunk's end and resume under the new weights).
A call is seeded by its oldest request's seed (a continuation's: seed + its tokens so far, so it does not replay
its first noise); its rows draw different noise from that one generator, so requests of different seeds share a
call, and a sampled response depends on which requests shared its call, as under vLLM's continuous batching.
Batching only requests of one seed would run one row per call, since the streamed rollout seeds each sample.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Protocol, runtime_checkable


from flowrl.data.batch import left_pad
from flowrl.engines.protocols import FinishReason, RolloutEngine
from flowrl.engines.streaming.worker import Job, StreamWorker


@runtime_checkable
class Interruptible(Protocol):
    """A batch engine whose running `generate` returns early, rows cut where they are, once `stop` is set."""

    stop: threading.Event


class ThreadedStreamer(StreamWorker):
    """Samples requests one by one over `engine.generate` in one worker thread (see the module docstring)."""

    def __init__(self, engine: RolloutEngine, *, max_batch: int = 64, chunk_tokens: int | None = None,
                 pad_id: int = 0, version: int = 0, start_timeout_s: float = 60.0,
                 pause_timeout_s: float = 600.0, close_timeout_s: float = 60.0):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if chunk_tokens is not None and chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1 or None, got {chunk_tokens}")
        self.engine, self.max_batch, self.chunk_tokens, self.pad_id = engine, max_batch, chunk_tokens, pad_id
        self.stop = engine.stop if isinstance(engine, Interruptible) else None
        super().__init__(name="ThreadedStreamer", version=version, start_timeout_s=start_timeout_s,
                         pause_timeout_s=pause_timeout_s, close_timeout_s=close_timeout_s)

    def work(self) -> None:
        jobs, version = self.take(self._pick)
        if not jobs:
            return
        budget = max(job.budget for job in jobs)
        params = jobs[0].params(min(budget, self.chunk_tokens or budget))
        ids_BP, mask_BP = left_pad([job.prompt for job in jobs], self.pad_id)
        try:
            out = self.engine.generate(ids_BP, mask_BP, params, seed=jobs[0].seed)
        finally:
            with self.cond:
                if self.stop is not None:
                    self.stop.clear()  # set only while this streamer's generate runs
                cut = self.stopping
        for job, ids, mask, logprobs, reason in zip(jobs, out["response_ids"].tolist(), out["response_mask"].tolist(),
                                                    out["rollout_logprobs"].tolist(), out["finish_reason"].tolist()):
            length = sum(mask)
            take = min(length, job.budget)
            if take == 0 and job.budget and not cut:
                raise RuntimeError(f"{type(self.engine).__name__}.generate returned no token for a row that had "
                                   f"{job.budget} to go and was not stopped")
            finish = FinishReason.STOP if reason == FinishReason.STOP and length <= job.budget else None
            self.settle(job, ids[:take], logprobs[:take], version, finish)

    def interrupt(self) -> None:
        if self.stop is not None:
            self.stop.set()

    def _pick(self, eligible: list[Job]) -> list[Job]:
        """The oldest eligible job and the next ones sampled the same way (their seeds aside), up to max_batch."""
        def key(job: Job) -> tuple:
            return replace(job.request.params, max_new_tokens=1)

        first = key(eligible[0])
        return [job for job in eligible if key(job) == first][:self.max_batch]
