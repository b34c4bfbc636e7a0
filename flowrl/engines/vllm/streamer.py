"""VLLMStreamer: a StreamingEngine (flowrl.engines.streaming.protocol) over flowrl's in-process vLLM engine.

Which vLLM API: `AsyncLLM` (vllm.v1.engine.async_llm) would be the natural asyncio engine, but vLLM 0.32
builds it only over an engine core in another process (`EngineCoreClient.make_client` raises "Running
EngineCore in asyncio without multiprocessing is not currently supported"), and flowrl's VLLMRolloutEngine runs
vLLM in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so that the weight sync hands it tensors by reference.
So this streamer drives that same in-process `LLMEngine` (`engine.llm.llm_engine`) request by request, as verl
and OpenRLHF did before AsyncLLM: `VLLMCore` is that engine as a StepCore (`add_request` with token ids in and
`RequestOutputKind.DELTA` out, `abort_request`, `step()`: vLLM's own continuous batching and scheduling), and
the SteppedStreamer (flowrl.engines.streaming.stepped) does the rest: a worker thread adds each waiting request,
steps while any run, resolves each as its final output arrives, and aborts and resumes from the prefix. The
weight sync, the LoRA adapter (`engine.lora`) and the sampling parameters (`VLLMRolloutEngine.sampling`,
`token_logprobs`) are the batch engine's: weights synced into `engine` between `pause` and `resume` are what
the next requests run on. Every token keeps vLLM's processed logprob (after temperature, top-k, top-p).

With `roles.rollout.tensor_parallel_size` k > 1 one engine spans k ranks (`external_launcher`) and
`make_streamer` gives each its part of the replica (flowrl.engines.streaming.lockstep): the replica's rank 0
a VLLMStreamer whose core sends every add, abort and step to the others, each of which a `Follower` over its
own VLLMCore; the replica starts paused (the first `resume` starts it).

Only the streamer's worker (a follower's thread) may touch the vLLM engine while it runs: call the batch
engine's `generate` or a weight sync only while paused (or after `close()`). Sleeping engines
(`free_cache_engine`) are refused.
"""

from __future__ import annotations

from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind

from flowrl.engines.protocols import SamplingParams
from flowrl.engines.streaming.lockstep import Channel, Follower, LeaderCore
from flowrl.engines.streaming.stepped import Delta, Refused, StepCore, SteppedStreamer
from flowrl.engines.vllm.rollout import VLLMRolloutEngine, token_logprobs

try:
    from vllm.exceptions import VLLMClientError  # vLLM 0.32: a request's own fault (e.g. past the context)
except ImportError:  # vLLM 0.26 (the GPU's) has no such class and raises ValueError for it
    VLLMClientError = ValueError


class VLLMCore(StepCore):
    """A VLLMRolloutEngine's in-process LLMEngine as a StepCore (flowrl.engines.streaming.stepped); its idle,
    pause, resume and close are StepCore's (nothing: the engine outlives its streamers)."""

    def __init__(self, engine: VLLMRolloutEngine):
        self.engine, self.llm_engine = engine, engine.llm.llm_engine

    def add(self, request_id: str, prompt: list[int], params: SamplingParams, seed: int | None) -> None:
        sampling = self.engine.sampling(params, seed)
        sampling.output_kind = RequestOutputKind.DELTA
        try:
            self.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt), sampling,
                                        lora_request=self.engine.lora)
        except (ValueError, VLLMClientError) as err:  # its own fault (e.g. past the model's context)
            raise Refused(err) from err

    def abort(self, request_ids: list[str]) -> None:
        self.llm_engine.abort_request(request_ids)

    def step(self) -> list[Delta]:
        out = []
        for output in self.llm_engine.step():
            completion = output.outputs[0]
            out.append(Delta(output.request_id, list(completion.token_ids), token_logprobs(completion),
                             completion.finish_reason if output.finished else None))
        return out


class VLLMStreamer(SteppedStreamer):
    """Samples requests one by one on a VLLMRolloutEngine's in-process vLLM (see the module docstring); on a
    tensor-parallel engine, the replica's leader."""

    def __init__(self, engine: VLLMRolloutEngine, *, version: int = 0, start_timeout_s: float = 60.0,
                 pause_timeout_s: float = 600.0, close_timeout_s: float = 60.0):
        check_awake(engine)
        core, channel = VLLMCore(engine), replica_channel(engine)
        if channel is not None and not channel.leader:
            raise ValueError("VLLMStreamer runs on a tensor-parallel replica's rank 0; make_streamer gives the "
                             "other ranks a Follower")
        super().__init__(core if channel is None else LeaderCore(core, channel), name="VLLMStreamer",
                         version=version, paused=channel is not None, start_timeout_s=start_timeout_s,
                         pause_timeout_s=pause_timeout_s, close_timeout_s=close_timeout_s)


def make_streamer(engine: VLLMRolloutEngine) -> VLLMStreamer | Follower:
    """This rank's part of a streamed replica (roles.rollout.engine=vllm's STREAMERS entry): the whole of it for
    tensor_parallel_size 1, else the leader (the replica's rank 0) or a follower."""
    channel = replica_channel(engine)
    if channel is None or channel.leader:
        return VLLMStreamer(engine)
    check_awake(engine)
    return Follower(VLLMCore(engine), channel)


def replica_channel(engine: VLLMRolloutEngine) -> Channel | None:
    """The lockstep channel of the engine's replica; None for an engine of one rank."""
    if engine.replica_group is None:
        return None
    return Channel(engine.replica_group, "cuda" if engine.cuda else "cpu")


def check_awake(engine: VLLMRolloutEngine) -> None:
    if engine.config.free_cache_engine:
        raise ValueError(f"roles.rollout.free_cache_engine={engine.config.free_cache_engine}: a streaming vLLM "
                         f"engine does not sleep between generations; set it to 0")

