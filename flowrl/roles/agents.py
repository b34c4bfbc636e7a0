"""`rollout.agents`: black-box agent episodes through the rollout's OpenAI-compatible endpoint, as training rows.

The rollout role starts the endpoint (flowrl.engines.service.endpoint) over its engine as a StreamingEngine on
the first call, and stops it when the run closes. Each prompt row's episode gets its own `base_url`
(`/episodes/<id>/v1`); the agent program (flowrl.engines.service.black_box_agents) talks to it with any OpenAI client;
its calls become the row (flowrl.engines.service.episodes): exactly the sampled tokens (loss 1), what the
client added between them (loss 0), the sampler's logprobs, and each token's policy version in
`token_versions`. The episode's reward is what the agent returned (0 when it failed or timed out); a reward
role called after `rollout.agents` may score the rows instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from tensordict import NonTensorStack, TensorDict

from flowrl import metrics
from flowrl.data.batch import left_pad, right_pad
from flowrl.data.imports import import_attribute
from flowrl.engines.protocols import FinishReason, SamplingParams
from flowrl.engines.service import black_box_agents as agents
from flowrl.engines.service.episodes import EpisodeTokens, episode_tokens
from flowrl.engines.streaming.protocol import StreamingEngine

AGENT_FIELDS = ("num_turns", "tool_error", "token_versions")  # what rollout.agents adds to generate's fields


@dataclass(frozen=True)
class AgentSpec:
    """Who plays `rollout.agents` episodes, and the endpoint they call (from roles.rollout.agent*, endpoint_*)."""

    agent: str | None = None  # "module:function" or "file.py:function"
    command: tuple[str, ...] = ()  # or a program per episode
    timeout_s: float = 300.0
    workers: int = 8
    max_total_tokens: int = 32
    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    chat_template: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def runner(self):
        if self.command:
            return agents.run_command(self.command, self.timeout_s)
        function = import_attribute(self.agent, "roles.rollout.agent: ", ())
        if not callable(function):
            raise ValueError(f"roles.rollout.agent: {self.agent!r} is a {type(function).__name__}, not a function")
        return lambda episode, outcome: agents.run_function(function, episode, outcome)


class AgentService:
    """The endpoint of one rollout role and the episodes it plays (see the module docstring)."""

    def __init__(self, spec: AgentSpec, engine: StreamingEngine, tokenizer: Any, params: SamplingParams, seed: int):
        from flowrl.engines.service.endpoint import Endpoint  # FastAPI and uvicorn: the `serve` extra, only here

        self.spec, self.tokenizer = spec, tokenizer
        self.endpoint = Endpoint(engine, tokenizer, params, host=spec.host, port=spec.port, token=spec.token,
                                 chat_template=spec.chat_template, seed=seed)
        self.endpoint.start()
        self.start_agent = spec.runner()

    def play(self, prompts: Sequence[list[int]], metas: Sequence[dict], params: SamplingParams,
             tag: str) -> tuple[list[EpisodeTokens], list[agents.Outcome]]:
        self.endpoint.params = params
        episodes = []
        for row, (prompt, meta) in enumerate(zip(prompts, metas)):
            episode_id = f"{tag}-{row}"
            self.endpoint.book.open(episode_id)
            episodes.append(agents.AgentEpisode(episode_id, self.endpoint.episode_url(episode_id),
                                                self.spec.token or "flowrl", self.tokenizer.decode(prompt),
                                                tuple(prompt), dict(meta)))
        calls = {}
        outcomes = agents.play(episodes, self.start_agent, timeout_s=self.spec.timeout_s, workers=self.spec.workers,
                               on_end=lambda e: calls.__setitem__(e.id, self.endpoint.book.close(e.id)))
        if self.endpoint.failure is not None:
            err = self.endpoint.failure
            raise RuntimeError(f"the rollout engine failed while serving agent episodes: {type(err).__name__}: "
                               f"{err}") from err
        tokens = [cut(episode_tokens(calls[e.id], list(e.prompt_ids)), self.spec.max_total_tokens) for e in episodes]
        return tokens, outcomes

    def close(self) -> None:
        self.endpoint.stop()


def cut(tokens: EpisodeTokens, budget: int) -> EpisodeTokens:
    """The row within `budget` response tokens (finish MAX_TOKENS when cut)."""
    if len(tokens.ids) > budget:
        for name in ("ids", "loss", "logprobs", "versions"):
            setattr(tokens, name, getattr(tokens, name)[:budget])
        tokens.finish = FinishReason.MAX_TOKENS
    return tokens


def agent_rows(rows: TensorDict, tokens: list[EpisodeTokens], outcomes: list[agents.Outcome], pad_id: int,
               key: str) -> TensorDict:
    """`rows` with each episode's prompt and response, its reward in `key` and what AGENT_FIELDS hold."""
    rows["prompt_ids"], rows["prompt_mask"] = left_pad([t.prompt for t in tokens], pad_id)
    rows["response_ids"], rows["response_mask"] = right_pad([t.ids for t in tokens], pad_id)
    rows["loss_mask"] = right_pad([t.loss for t in tokens], 0)[0]
    rows["rollout_logprobs"] = right_pad([t.logprobs for t in tokens], 0.0, torch.float32)[0]
    rows["token_versions"] = right_pad([t.versions for t in tokens], -1)[0]
    rows["finish_reason"] = torch.tensor([int(t.finish) for t in tokens])
    rows[key] = torch.tensor([0.0 if o.timed_out or o.reward is None else o.reward for o in outcomes])
    rows["num_turns"] = torch.tensor([t.calls for t in tokens])
    rows["tool_error"] = NonTensorStack(*[o.error for o in outcomes])
    metrics.log("agent/timed_out", sum(o.timed_out for o in outcomes))
    metrics.log("agent/failed", sum(bool(o.error) and not o.timed_out for o in outcomes))
    metrics.log("agent/calls/mean", sum(t.calls for t in tokens) / len(tokens))
    metrics.log("agent/unchained_calls", sum(t.unchained for t in tokens))
    return rows
