"""An OpenAI-compatible endpoint in front of a StreamingEngine (one engine, or a Router over replicas).

Routes (FastAPI, served by uvicorn in a daemon thread):

- `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`: what OpenAI clients call. Chat messages
  become token ids through the tokenizer's chat template; nothing the model sampled is re-tokenised.
- the same under `/episodes/{episode}/v1/...`: an agent episode's own `base_url`. Its calls are recorded
  (flowrl.engines.service.episodes) so the trainer trains on exactly the sampled tokens. A closed episode
  (its agent ran past its deadline) is answered 410.

Every response carries, beside OpenAI's fields, `prompt_token_ids`, `token_ids`, `token_logprobs` (the sampler's
logprob of each sampled token) and `policy_versions` (the weights' version that sampled each).

Sampling is the run's (`params`): a request's `temperature`, `top_p` or `top_k` that differs from it is refused
(400, one line) since the trainer scores tokens under the run's distribution; `max_tokens` is capped at the
run's `max_new_tokens`; `stop` strings cut the response after the token that completes one; `n` > 1 and
`stream` are refused. Bound to 127.0.0.1 unless told otherwise; any other host needs a token
(`Authorization: Bearer TOKEN`), and a token, when set, is required on every route.

When the engine fails under a call (it raises: a streaming engine's dead worker fails every request it holds),
that call is answered 500 at once, `{"error": {"message": "the rollout engine failed: <error>", "type":
"server_error"}}`, and every later call 503 with the same error, sent to no engine; `failure` holds the first
error for the run (flowrl.roles.agents stops its episodes and the step on it). A call the engine does not answer
within `request_timeout_s` is answered 504.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import threading
import time
import zlib
from dataclasses import replace
from typing import Any

import uvicorn
from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse

from flowrl.engines.protocols import FinishReason, SamplingParams
from flowrl.engines.service.episodes import Call, EpisodeBook
from flowrl.engines.streaming.protocol import Request, StreamingEngine

LOOPBACK = ("127.0.0.1", "localhost", "::1")
SAMPLING_FIELDS = ("temperature", "top_p", "top_k")


class RefusedRequest(ValueError):
    """A request the endpoint answers with an HTTP error (its status and one line)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Endpoint:
    """The server (see the module docstring); `start()` returns its base URL."""

    def __init__(self, engine: StreamingEngine, tokenizer: Any, params: SamplingParams, *, model: str = "flowrl",
                 host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 chat_template: str | None = None, request_timeout_s: float = 600.0,
                 start_timeout_s: float = 30.0, seed: int = 0):
        if host not in LOOPBACK and not token:
            raise ValueError(f"roles.rollout.endpoint_host={host!r} is reachable from other machines: set "
                             "roles.rollout.endpoint_token")
        self.engine, self.tokenizer, self.params, self.model = engine, tokenizer, params, model
        self.host, self.port, self.token, self.chat_template = host, port, token, chat_template
        self.request_timeout_s, self.start_timeout_s, self.seed = request_timeout_s, start_timeout_s, seed
        self.book = EpisodeBook()
        self.failure: BaseException | None = None  # the engine's first failure while serving
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None
        self.counter = itertools.count()
        self.app = self.routes(FastAPI(title="flowrl rollout endpoint"))

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def episode_url(self, episode: str) -> str:
        return f"http://{self.host}:{self.port}/episodes/{episode}/v1"

    def start(self) -> str:
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning", lifespan="off",
                                access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="flowrl-endpoint")
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the rollout endpoint did not start on {self.host}:{self.port} within "
                                   f"{self.start_timeout_s:g} s")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self.base_url

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(timeout_s)
            self.server = self.thread = None

    def routes(self, app: FastAPI) -> FastAPI:
        for prefix in ("", "/episodes/{episode}"):
            app.post(prefix + "/v1/completions")(self.guarded(self.completion))
            app.post(prefix + "/v1/chat/completions")(self.guarded(self.chat))
            app.get(prefix + "/v1/models")(self.guarded(self.models))
        app.post("/tokenize")(self.guarded(self.tokenize))  # as vLLM's server: text to the ids it samples from
        return app

    def guarded(self, handler):
        async def route(request: HTTPRequest, episode: str | None = None) -> JSONResponse:
            try:
                self.authorize(request)
                body = await request.json() if request.method == "POST" else {}
                if not isinstance(body, dict):
                    raise RefusedRequest(400, "the request body must be a JSON object")
                return JSONResponse(await handler(body, episode))
            except RefusedRequest as err:
                kind = "server_error" if err.status >= 500 else "invalid_request_error"
                return JSONResponse({"error": {"message": str(err), "type": kind}}, status_code=err.status)
            except ValueError as err:  # a malformed JSON body
                return JSONResponse({"error": {"message": f"bad request: {err}", "type": "invalid_request_error"}},
                                    status_code=400)
        route.__name__ = handler.__name__
        return route

    def authorize(self, request: HTTPRequest) -> None:
        if self.token is None:
            return
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise RefusedRequest(401, "missing or wrong bearer token")

    async def tokenize(self, body: dict, episode: str | None) -> dict:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise RefusedRequest(400, "prompt must be a string")
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        return {"tokens": ids, "count": len(ids), "max_model_len": None}

    async def models(self, body: dict, episode: str | None) -> dict:
        return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "flowrl"}]}

    async def completion(self, body: dict, episode: str | None) -> dict:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            ids = prompt
        else:
            raise RefusedRequest(400, "prompt must be a string or a list of token ids")
        call, text = await self.sample(ids, body, episode)
        return {**self.head("text_completion", call),
                "choices": [{"index": 0, "text": text, "finish_reason": finish_name(call.finish),
                             "logprobs": None}]}

    async def chat(self, body: dict, episode: str | None) -> dict:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RefusedRequest(400, "messages must be a non-empty list of objects")
        try:
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                     chat_template=self.chat_template, tools=body.get("tools"))
        except Exception as err:  # the template's own error, one line
            raise RefusedRequest(400, f"the chat template refused the messages: {err}") from None
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        call, text = await self.sample(ids, body, episode)
        return {**self.head("chat.completion", call),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": finish_name(call.finish)}]}

    def head(self, kind: str, call: Call) -> dict:
        return {"id": f"flowrl-{next(self.counter)}", "object": kind, "created": int(time.time()),
                "model": self.model, "prompt_token_ids": list(call.prompt_ids), "token_ids": list(call.response_ids),
                "token_logprobs": list(call.logprobs), "policy_versions": list(call.versions),
                "usage": {"prompt_tokens": len(call.prompt_ids), "completion_tokens": len(call.response_ids),
                          "total_tokens": len(call.prompt_ids) + len(call.response_ids)}}

    async def sample(self, ids: list[int], body: dict, episode: str | None) -> tuple[Call, str]:
        if self.failure is not None:
            raise RefusedRequest(503, f"the rollout engine failed earlier: {one_line(self.failure)}")
        if episode is not None and not self.book.is_open(episode):
            raise RefusedRequest(410, f"episode {episode!r} is not open (it ended, or ran past its deadline)")
        params, stops = self.sampling(body)
        seed = body.get("seed")
        request = Request(tuple(ids), params, seed=seed if isinstance(seed, int) else self.next_seed(episode),
                          key=episode)
        try:
            sample = await asyncio.wait_for(self.engine.sample(request), self.request_timeout_s)
        except asyncio.TimeoutError:
            raise RefusedRequest(504, f"no response within {self.request_timeout_s:g} s") from None
        except Exception as err:  # the engine failed: the caller is told, the run learns it from `failure`
            self.failure = self.failure or err
            raise RefusedRequest(500, f"the rollout engine failed: {one_line(err)}") from None
        response, logprobs, versions, finish = cut_at_stop(self.tokenizer, sample, stops)
        call = Call(tuple(ids), tuple(response), tuple(logprobs), tuple(versions), finish)
        if episode is not None and not self.book.record(episode, call):
            raise RefusedRequest(410, f"episode {episode!r} ended while its call ran")
        text = self.tokenizer.decode(response, skip_special_tokens=True)
        cuts = [text.index(stop) for stop in stops if stop in text]
        return call, text[:min(cuts)] if cuts else text

    def next_seed(self, episode: str | None) -> int:
        """An episode's calls are seeded by the episode and the call's place in it (so a run repeats however its
        episodes interleave); other calls in arrival order."""
        if episode is None:
            return (self.seed * 1_000_003 + next(self.counter)) % (2**31)
        return (self.seed * 1_000_003 + zlib.crc32(episode.encode()) + 7_919 * self.book.count(episode)) % (2**31)

    def sampling(self, body: dict) -> tuple[SamplingParams, list[str]]:
        """The run's sampling with the request's token limit, and its stop strings; what would change the
        distribution the trainer scores under is refused."""
        if body.get("stream"):
            raise RefusedRequest(400, "stream=true is not supported by this endpoint")
        if body.get("n", 1) != 1:
            raise RefusedRequest(400, f"n={body.get('n')!r}: one choice per request")
        for name in SAMPLING_FIELDS:
            value = body.get(name)
            if value is not None and value != getattr(self.params, name):
                raise RefusedRequest(400, f"{name}={value!r} differs from the run's roles.rollout.{name}="
                                          f"{getattr(self.params, name)!r}: the trainer scores tokens under the "
                                          "run's sampling")
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise RefusedRequest(400, f"max_tokens must be a positive int, got {limit!r}")
        budget = min(limit or self.params.max_new_tokens, self.params.max_new_tokens)
        stop = body.get("stop") or []
        stops = [stop] if isinstance(stop, str) else list(stop)
        if not all(isinstance(s, str) and s for s in stops):
            raise RefusedRequest(400, "stop must be a string or a list of non-empty strings")
        return replace(self.params, max_new_tokens=budget), stops


def cut_at_stop(tokenizer: Any, sample, stops: list[str]) -> tuple[list[int], list[float], list[int], FinishReason]:
    """The sample's tokens through the first one whose text completes a stop string (all when none does)."""
    ids = sample.response_ids
    if stops:
        for end in range(1, len(ids) + 1):
            if any(stop in tokenizer.decode(ids[:end], skip_special_tokens=True) for stop in stops):
                return ids[:end], sample.logprobs[:end], sample.versions[:end], FinishReason.STOP
    return list(ids), list(sample.logprobs), list(sample.versions), sample.finish


def one_line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())[:500]


def finish_name(finish: FinishReason) -> str:
    return "stop" if finish == FinishReason.STOP else "length"
