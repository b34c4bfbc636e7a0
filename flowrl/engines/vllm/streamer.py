"""VLLMStreamer: a StreamingEngine (flowrl.engines.streaming.protocol) over flowrl's in-process vLLM engine.

Which vLLM API: `AsyncLLM` (vllm.v1.engine.async_llm) would be the natural asyncio engine, but vLLM 0.32
builds it only over an engine core in another process (`EngineCoreClient.make_client` raises "Running
EngineCore in asyncio without multiprocessing is not currently supported"), and flowrl's VLLMRolloutEngine runs
vLLM in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so that the weight sync hands it tensors by reference.
So this streamer drives that same in-process `LLMEngine` (`engine.llm.llm_engine`) request by request, as verl
and OpenRLHF did before AsyncLLM: one worker thread (flowrl.engines.streaming.worker) `add_request`s each waiting
request (token ids in, `RequestOutputKind.DELTA` out), calls `step()` while any run (vLLM's own continuous
batching and scheduling) and resolves each request as its final output arrives. The weight sync, the LoRA
adapter (`engine.lora`) and the sampling parameters (`VLLMRolloutEngine.sampling`, `token_logprobs`) are the
batch engine's: weights synced into `engine` between `pause` and `resume` are what the next requests run on.

Every token keeps vLLM's processed logprob (the sampler's, after temperature, top-k, top-p). An abort
(`pause(abort=True)`) runs in the worker thread between two steps: the tokens delivered so far (the deltas are
accumulated as they arrive) are the request's prefix, then `abort_request` drops it from vLLM; after
`resume(version)` it is added again (a new vLLM request id) with prompt + prefix and the budget left, and a
seeded request with seed + its tokens so far.

Only this streamer's worker may touch the vLLM engine while it runs: call the batch engine's `generate` or a
weight sync only while paused (or after `close()`). One engine spans one process: tensor parallel engines and
sleeping ones (`free_cache_engine`) are refused.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind

from flowrl.engines.protocols import FinishReason
from flowrl.engines.streaming.worker import Job, StreamWorker
from flowrl.engines.vllm.rollout import VLLMRolloutEngine, token_logprobs

try:
    from vllm.exceptions import VLLMClientError  # vLLM 0.32: a request's own fault (e.g. past the context)
except ImportError:  # vLLM 0.26 (the GPU's) has no such class and raises ValueError for it
    VLLMClientError = ValueError

FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}  # vLLM's finish_reason


@dataclass(eq=False)
class _Live:
    """A job added to vLLM: the version it runs under and the tokens delivered so far."""

    job: Job
    version: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class VLLMStreamer(StreamWorker):
    """Samples requests one by one on a VLLMRolloutEngine's in-process vLLM (see the module docstring)."""

    def __init__(self, engine: VLLMRolloutEngine, *, version: int = 0, start_timeout_s: float = 60.0,
                 pause_timeout_s: float = 600.0, close_timeout_s: float = 60.0):
        if engine.config.free_cache_engine:
            raise ValueError(f"roles.rollout.free_cache_engine={engine.config.free_cache_engine}: a streaming vLLM "
                             f"engine does not sleep between generations; set it to 0")
        if engine.tp_ranks > 1:
            raise ValueError(f"roles.rollout.tensor_parallel_size={engine.tp_ranks}: streaming rollouts need one "
                             f"vLLM engine per process (tensor_parallel_size=1)")
        self.engine, self.core = engine, engine.llm.llm_engine
        self.live: dict[str, _Live] = {}  # by vLLM request id
        self.attempts = itertools.count()
        super().__init__(name="VLLMStreamer", version=version, start_timeout_s=start_timeout_s,
                         pause_timeout_s=pause_timeout_s, close_timeout_s=close_timeout_s)

    def work(self) -> None:
        jobs, version = self.take(list, wait=not self.live)
        for job in jobs:
            self._add(job, version)
        self._drop_cancelled()
        if self.live and self.stopping:
            self._abort_live()
        elif self.live:
            for output in self.core.step():
                self._receive(output)

    def finish_work(self) -> None:
        """Leaves no request of this streamer inside vLLM (a later batch generate would step them)."""
        if self.live:
            self.core.abort_request(list(self.live))
            self.live.clear()

    def _add(self, job: Job, version: int) -> None:
        request_id = f"{job.request.id}.{next(self.attempts)}"
        params = self.engine.sampling(job.params(), job.seed)
        params.output_kind = RequestOutputKind.DELTA
        try:
            self.core.add_request(request_id, TokensPrompt(prompt_token_ids=job.prompt), params,
                                  lora_request=self.engine.lora)
        except (ValueError, VLLMClientError) as err:  # its own fault (e.g. past the model's context): it alone fails
            self.fail(job, err)
            return
        self.live[request_id] = _Live(job, version)

    def _receive(self, output) -> None:
        live = self.live[output.request_id]
        completion = output.outputs[0]
        live.ids += completion.token_ids
        live.logprobs += token_logprobs(completion)
        if output.finished:
            del self.live[output.request_id]
            if completion.finish_reason not in FINISH:
                raise RuntimeError(f"vLLM finished request {output.request_id} with {completion.finish_reason!r}")
            self.settle(live.job, live.ids, live.logprobs, live.version, FINISH[completion.finish_reason])

    def _drop_cancelled(self) -> None:
        """Aborts the requests whose callers gave up (a cancelled `await sample(...)`): vLLM stops sampling them."""
        gone = [request_id for request_id, live in self.live.items() if live.job.future.done()]
        if gone:
            self.core.abort_request(gone)
            for request_id in gone:
                self.fail(self.live.pop(request_id).job, asyncio.CancelledError())

    def _abort_live(self) -> None:
        """Cuts every running request where it is: what it sampled so far is its prefix."""
        self.core.abort_request(list(self.live))
        lives, self.live = list(self.live.values()), {}
        for live in lives:
            self.settle(live.job, live.ids, live.logprobs, live.version, None)
