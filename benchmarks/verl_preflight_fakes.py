"""The stand-ins benchmarks/verl_preflight.py's stages put around verl's own classes on the CPU: Ray's actor handles
(Handle, Remote: each call's arguments and result through cloudpickle), its async actors' one event loop
(run_async), verl's vLLM server (FakeVLLMServer), the LLM client in front of it (fake_llm_client: verl's own
LLMServerClient and GlobalRequestLoadBalancer), AgentLoopManagerTQ over one in-process worker (LocalTQManager), and
the stages' `check` (a Failed with the reason). verl is imported inside the functions: this module also loads in
the project's packages, where verl is absent."""

from __future__ import annotations

import json
import os
from pathlib import Path


class Failed(Exception):
    """A stage's check refused: the message is the reason its line gives."""


def check(want: bool, message: str) -> None:
    if not want:
        raise Failed(message)


def run_async(coro):
    """On the one event loop every verl object here captured (verl.utils.ray_utils.get_event_loop), as a Ray async
    actor runs all its calls on its own loop."""
    from verl.utils.ray_utils import get_event_loop

    return get_event_loop().run_until_complete(coro)


class Remote:
    """A stand-in for one method of a Ray actor handle: `.remote(...)` runs the method on the event loop and
    returns an awaitable, the arguments and result passed through cloudpickle as Ray's serialization would."""

    def __init__(self, fn, serialize: bool):
        self.fn, self.serialize = fn, serialize

    def remote(self, *args, **kwargs):
        import asyncio
        import inspect

        from ray import cloudpickle

        if self.serialize:
            args, kwargs = cloudpickle.loads(cloudpickle.dumps((args, kwargs)))

        async def call():
            out = self.fn(*args, **kwargs)
            if inspect.isawaitable(out):
                out = await out
            return cloudpickle.loads(cloudpickle.dumps(out)) if self.serialize else out

        return asyncio.ensure_future(call())


class Handle:
    """A stand-in for a Ray actor handle over a local object."""

    def __init__(self, obj, serialize: bool = True):
        self._obj, self._serialize = obj, serialize

    def __getattr__(self, name):
        return Remote(getattr(self._obj, name), self._serialize)


class FakeVLLMServer:
    """What verl's vLLM server (verl/workers/rollout/vllm_rollout/vllm_async_server.py, vLLMHttpServer) does
    around the engine, with random tokens in place of the engine: the config checks of _validate_configs, the
    max_tokens, logprobs and ignore_eos rules of generate, a TokenOutput back."""

    def __init__(self, rollout, hf_config, eos_id: int, im_end_id: int, newline_id: int, vocab: int,
                 draws: list[int] | None):
        import random

        from verl.workers.rollout.utils import get_max_position_embeddings

        self.rollout, self.eos, self.im_end, self.newline, self.vocab = rollout, eos_id, im_end_id, newline_id, vocab
        max_positions = get_max_position_embeddings(hf_config)
        max_model_len = rollout.max_model_len if rollout.max_model_len is not None else max_positions
        check(max_model_len <= max_positions, f"max_model_len ({max_model_len}) should be less than or equal to "
                                              f"max_position_embeddings ({max_positions}) (vllm_async_server.py "
                                              "_validate_configs)")
        self.max_model_len = max_model_len
        self.draws, self.next_draw = draws, 0
        self.rng = random.Random(0)
        self.calls: dict[tuple[int, ...], list[dict]] = {}  # prompt ids -> what each request got

    async def generate(self, request_id, prompt_ids, sampling_params, image_data=None, video_data=None,
                       priority=0, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        sampling_params = dict(sampling_params)
        max_possible = self.max_model_len - len(prompt_ids)
        check(max_possible >= 1, f"Prompt length ({len(prompt_ids)}) leaves no room to generate within the model's "
                                 f"maximum context length ({self.max_model_len})")
        if "max_tokens" in sampling_params:
            max_tokens = sampling_params.pop("max_tokens")
        elif "max_new_tokens" in sampling_params:
            max_tokens = sampling_params.pop("max_new_tokens")
        else:
            cfg = self.rollout
            max_tokens = min(cfg.response_length, cfg.prompt_length + cfg.response_length - len(prompt_ids))
        max_tokens = max(1, min(max_tokens, max_possible))
        want_logprobs = bool(sampling_params.pop("logprobs", False))
        ignore_eos = sampling_params.get("ignore_eos", self.rollout.get("ignore_eos", False))
        for key in ("temperature", "top_p", "top_k", "repetition_penalty"):
            check(key in sampling_params, f"sampling_params lacks {key}: {sampling_params}")
        ids = [self.rng.randrange(2, self.vocab) for _ in range(max_tokens)]
        if ignore_eos:  # fixed lengths: every row to max_tokens; eos, <|im_end|> and "\n" may come up inside
            length, end = max_tokens, None
            for i in range(0, max_tokens, 37):
                ids[i] = (self.eos, self.im_end, self.newline)[i % 3]
        else:  # the n-th request takes draw n and ends with eos there (forced_lengths.EosAtDrawnLength)
            if self.draws is not None:
                check(self.next_draw < len(self.draws), f"FLOWRL_BENCH_LENGTHS: draws end at {len(self.draws)}")
                length = min(self.draws[self.next_draw], max_tokens)
                self.next_draw += 1
            else:
                length = self.rng.randint(1, max_tokens)
            end = self.im_end if self.next_draw % 7 == 3 else self.eos
            ids = ids[:length]
            ids[-1] = end
            ids[:-1] = [t if t not in (self.eos, self.im_end) else 2 for t in ids[:-1]]
        logprobs = [-self.rng.random() * 10 for _ in ids] if want_logprobs else None
        self.calls.setdefault(tuple(prompt_ids), []).append({"ids": ids, "logprobs": logprobs, "end": end})
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="completed", num_preempted=0,
                           extra_fields={"global_steps": 1, "num_cached_tokens": 0})


def fake_llm_client(ctx):
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    spec, tokenizer = ctx["spec"], ctx["tokenizer"]
    lengths_file = os.environ.get("FLOWRL_BENCH_LENGTHS") or spec.get("draws")  # what verl's vLLM plugin reads
    draws = json.loads(Path(lengths_file).read_text()) if spec["lengths"] == "variable" and lengths_file else None
    server = FakeVLLMServer(ctx["rollout"], ctx["model_config"].hf_config, tokenizer.eos_token_id, ctx["im_end"],
                            ctx["newline"], spec["vocab_size"], draws)
    balancer = GlobalRequestLoadBalancer({"replica_0": Handle(server)})
    return LLMServerClient(ctx["config"], Handle(balancer, serialize=False)), server


class LocalTQManager:
    """AgentLoopManagerTQ.generate_sequences (verl/trainer/ppo/v1/agent_loop_tq.py) over one in-process
    AgentLoopWorkerTQ: the batch chunked by rollout.agent.num_workers, each chunk's background agent loops run to
    their end (on the GPU machine they run on in the workers' own processes while the trainer samples)."""

    def __init__(self, worker, num_workers: int):
        self.worker, self.num_workers = worker, num_workers

    def generate_sequences(self, prompts) -> None:
        import asyncio

        async def run():
            for chunk in prompts.chunk(self.num_workers):
                await self.worker.generate_sequences(chunk)
            while self.worker.background_tasks:
                await asyncio.sleep(0.02)

        run_async(run())
