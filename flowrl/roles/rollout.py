"""The rollout role: samples responses (`generate`) or plays multi-turn episodes in an environment (`interact`)
with the actor's weights, synced before each step's first generation."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from tensordict import NonTensorStack, TensorDict

from flowrl import metrics
from flowrl.data.batch import column, repeat_rows, response_lengths, right_pad
from flowrl.data.multiturn.envs import EnvSpec
from flowrl.engines.agents.loop import run_episodes
from flowrl.engines.agents.async_loop import run_episodes_async
from flowrl.engines.protocols import FinishReason, RolloutEngine, SamplingParams, WeightSync
from flowrl.engines.sampling import SAMPLED_WITH, sampling_columns
from flowrl.engines.streaming.protocol import Request, Sample, StreamingEngine
from flowrl.errors import GraphError
from flowrl.graph.context import CallInfo, calling, current_call
from flowrl.graph.role import graph_method, role
from flowrl.roles.agents import AGENT_FIELDS, AgentService, AgentSpec, agent_rows
from flowrl.roles.configs import RolloutConfig

GENERATED = ("response_ids", "response_mask", "loss_mask", "rollout_logprobs", "finish_reason", "policy_version",
             "group", *SAMPLED_WITH)
EPISODE = ("num_turns", "tool_error")  # what rollout.interact adds: turns played, the first tool error ("" if none)


def _check_sampling(n: int = 1, **sampling: Any) -> None:
    if not isinstance(n, int) or n < 1:
        raise GraphError(f"rollout.generate: n must be an int >= 1, got {n!r}")
    unknown = sorted(set(sampling) - set(SamplingParams.__dataclass_fields__))
    if unknown:
        raise GraphError(f"rollout.generate: unknown sampling option {unknown[0]!r}; "
                         f"options are {sorted(SamplingParams.__dataclass_fields__)}")


def _episode_writes(key: str = "scores", **_: Any) -> tuple[str, ...]:
    return (*GENERATED, key, *EPISODE)


def _agent_writes(key: str = "scores", **_: Any) -> tuple[str, ...]:
    return (*GENERATED, key, *AGENT_FIELDS)


def _check_episode(n: int = 1, key: str = "scores", metric: str = "reward", **sampling: Any) -> None:
    _check_sampling(n, **sampling)


@role("rollout", weights_from="actor", engines=("rollout",), config=RolloutConfig)
@dataclass
class Rollout:
    engine: RolloutEngine
    params: SamplingParams
    source: Any = None  # the role whose weights this one follows, when it lives in this process
    weight_sync: WeightSync | None = None
    seed: int = 0
    synced_version: int = 0  # the source's update count this engine holds
    env: EnvSpec | None = None  # rollout.interact's environment (roles.rollout.env)
    tokenizer: Any = None  # what environments decode turns and encode observations with
    meta_keys: tuple[str, ...] = ()  # the task's metadata columns, handed to each episode's reset
    pad_id: int = 0  # the tokenizer's pad token, right of streamed responses (`generate`'s engine pads its own)
    max_in_flight: int = 64  # streamed rollouts (flowrl.runtime.offpolicy.streaming): roles.rollout.max_in_flight,
    partial: bool = False  # roles.rollout.partial,
    stream_timeout_s: float = 600.0  # roles.rollout.stream_timeout_s
    make_streamer: Callable[[RolloutEngine], StreamingEngine] | None = None  # the engine config's `streamer`
    streamer: StreamingEngine | None = None  # `engine` as a StreamingEngine, made on first use
    agent: AgentSpec | None = None  # rollout.agents' agent program and endpoint (roles.rollout.agent, ...)
    service: AgentService | None = None  # the endpoint, started on the first rollout.agents call

    @graph_method(reads=("prompt_ids", "prompt_mask", "uid"), writes=GENERATED, kind="rows", check=_check_sampling,
                  rows_per_input="n")
    def generate(self, batch: TensorDict, n: int = 1, **sampling: Any) -> TensorDict:
        """n responses per prompt row (adjacent); each row's `group` is its prompt's uid."""
        _check_sampling(n, **sampling)
        params, rows, seed = self._start(batch, n, sampling)
        out = self.engine.generate(rows["prompt_ids"], rows["prompt_mask"], params, seed=seed)
        out["loss_mask"] = out["response_mask"].clone()
        rows = self._finish(rows, out, params)
        metrics.log("response_length/clip_ratio", (response_lengths(rows) >= params.max_new_tokens).float().mean())
        return rows

    @graph_method(reads=("prompt_ids", "prompt_mask", "uid"), writes=_episode_writes, kind="rows",
                  check=_check_episode, rows_per_input="n")
    def interact(self, batch: TensorDict, n: int = 1, key: str = "scores", metric: str = "reward",
                 **sampling: Any) -> TensorDict:
        """n episodes per prompt row in roles.rollout.env (flowrl.engines.agents.loop; flowrl.engines.agents.async_loop
        with roles.rollout.async_episodes), adjacent; `key` holds each
        episode's summed reward (logged as `<metric>/mean`), `num_turns` and `tool_error` its turns and first
        tool error; max_new_tokens bounds each turn."""
        if self.env is None:
            raise ValueError("rollout.interact plays episodes in an environment: set roles.rollout.env (e.g. "
                             "calculator)")
        params, rows, seed = self._start(batch, n, sampling)
        prompts, metas = self._episode_inputs(rows)
        envs = [self.env.make(self.tokenizer) for _ in prompts]
        for env, prompt, meta in zip(envs, prompts, metas):
            env.reset(prompt, meta)
        limits = dict(max_turns=self.env.max_turns, max_total_tokens=self.env.max_total_tokens,
                      pad_id=self.tokenizer.pad_token_id, seed=seed, step_timeout_s=self.env.step_timeout_s)
        if self.env.async_episodes:  # roles.rollout.async_episodes: each episode a coroutine
            out, stats = run_episodes_async(self.streaming_engine(), envs, prompts, params, **limits,
                                            env_workers=self.env.num_workers, sample_timeout_s=self.stream_timeout_s)
        else:
            with ThreadPoolExecutor(self.env.num_workers) if self.env.num_workers else nullcontext() as pool:
                out, stats = run_episodes(self.engine, envs, prompts, params, **limits, pool=pool)
        rows = self._finish(rows, out, params)
        rows[key], rows["num_turns"] = out["scores"], out["num_turns"]
        rows["tool_error"] = NonTensorStack(*stats["tool_error"])
        metrics.log(f"{metric}/mean", out["scores"].mean())
        metrics.log("env/turns/mean", out["num_turns"].float().mean())
        metrics.log("env/tool_calls/mean", sum(stats["tool_calls"]) / len(prompts))
        metrics.log("env/tool_error_rate", sum(map(bool, stats["tool_error"])) / len(prompts))
        for reason in FinishReason:
            metrics.log(f"env/finish/{reason.name.lower()}", (out["finish_reason"] == reason).float().mean())
        metrics.log("timing_s/env", stats["timing_s/env"])
        return rows

    @graph_method(reads=("prompt_ids", "prompt_mask", "uid"), writes=_agent_writes, kind="rows",
                  check=_check_episode)
    def agents(self, batch: TensorDict, n: int = 1, key: str = "scores", metric: str = "reward",
               **sampling: Any) -> TensorDict:
        """n episodes per prompt row played by roles.rollout.agent (a program) through the rollout's
        OpenAI-compatible endpoint (flowrl.roles.agents); each row holds exactly the tokens sampled, and `key`
        the agent's reward; max_new_tokens bounds each call, roles.rollout.max_total_tokens the episode."""
        if self.agent is None:
            raise ValueError("rollout.agents plays episodes of an agent program: set roles.rollout.agent "
                             "('module:function') or roles.rollout.agent_command")
        params, rows, seed = self._start(batch, n, sampling)
        engine = self.streaming_engine()
        if engine.version != self.synced_version:
            engine.resume(self.synced_version)
        if self.service is None:
            self.service = AgentService(self.agent, engine, self.tokenizer, params, seed)
        self.service.endpoint.seed = seed
        prompts, metas = self._episode_inputs(rows)
        call = current_call()
        tokens, outcomes = self.service.play(prompts, metas, params,
                                             tag=f"s{call.step}c{call.call}")
        rows = agent_rows(rows, tokens, outcomes, self.pad_id, key)
        for name, value in sampling_columns(params, rows.batch_size[0]).items():
            rows[name] = value.to(rows.device)
        versions = rows["token_versions"].masked_fill(rows["token_versions"] < 0, self.synced_version)
        rows["policy_version"] = versions.min(-1).values
        rows["group"] = rows["uid"].clone()
        metrics.log(f"{metric}/mean", rows[key].mean())
        metrics.log("response_length/mean", response_lengths(rows).float().mean())
        return rows

    def _episode_inputs(self, rows: TensorDict) -> tuple[list[list[int]], list[dict[str, Any]]]:
        """Each row's unpadded prompt ids and the task's metadata for it (empty dicts without meta keys)."""
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(rows["prompt_ids"], rows["prompt_mask"])]
        metas = [dict(zip(self.meta_keys, values)) for values in zip(*(column(rows, k) for k in self.meta_keys))]
        return prompts, metas or [{} for _ in prompts]

    def _start(self, batch: TensorDict, n: int, sampling: dict[str, Any]) -> tuple[SamplingParams, TensorDict, int]:
        """The call's sampling, its rows (each prompt n times) and its seed."""
        params = SamplingParams(**{**self.params.__dict__, **sampling})
        call = current_call()
        return params, repeat_rows(batch, n), (self.seed * 1_000_003 + call.step * 1_009 + call.call) % (2**31)

    def _finish(self, rows: TensorDict, out: TensorDict, params: SamplingParams) -> TensorDict:
        """The generated fields, and how each row was sampled (SAMPLED_WITH: what the trainer scores it under)."""
        for key in ("response_ids", "response_mask", "loss_mask", "rollout_logprobs", "finish_reason"):
            rows[key] = out[key]
        for key, value in sampling_columns(params, rows.batch_size[0]).items():
            rows[key] = value.to(rows.device)
        rows["policy_version"] = torch.full((rows.batch_size[0],), self.synced_version, dtype=torch.long)
        rows["group"] = rows["uid"].clone()
        metrics.log("response_length/mean", response_lengths(rows).float().mean())
        return rows

    def requests(self, batch: TensorDict, info: CallInfo, n: int = 1,
                 **sampling: Any) -> tuple[TensorDict, list[Request]]:
        """Streamed `generate`: its rows (each prompt n times) and one Request per row, row r seeded with the
        seed `generate` would use as call `info`, plus r."""
        _check_sampling(n, **sampling)
        with calling(info):
            params, rows, seed = self._start(batch, n, sampling)
        prompts = [tuple(ids[mask.bool()].tolist()) for ids, mask in zip(rows["prompt_ids"], rows["prompt_mask"])]
        groups = rows["uid"].tolist()  # a group's samples share a replica's prefix cache (Request.key)
        return rows, [Request(prompt, params, seed=(seed + r) % (2**31), key=f"group-{group}")
                      for r, (prompt, group) in enumerate(zip(prompts, groups))]

    def streamed(self, rows: TensorDict, samples: list[Sample]) -> TensorDict:
        """`rows` (from `requests`) with their finished samples: the fields `generate` writes, `policy_version_min`
        and `policy_version_max` over each sample's tokens (`policy_version` is the min)."""
        params = samples[0].request.params
        ids_BR, mask_BR = right_pad([s.response_ids for s in samples], self.pad_id)
        out = TensorDict({"response_ids": ids_BR, "response_mask": mask_BR, "loss_mask": mask_BR.clone(),
                          "rollout_logprobs": right_pad([s.logprobs for s in samples], 0.0, torch.float32)[0],
                          "finish_reason": torch.tensor([int(s.finish) for s in samples])}, batch_size=[len(samples)])
        rows = self._finish(rows, out, params)
        rows["policy_version_min"] = torch.tensor([s.min_version for s in samples], dtype=torch.long)
        rows["policy_version_max"] = torch.tensor([s.max_version for s in samples], dtype=torch.long)
        rows["policy_version"] = rows["policy_version_min"].clone()
        metrics.log("response_length/clip_ratio", (response_lengths(rows) >= params.max_new_tokens).float().mean())
        return rows

    def streaming_engine(self) -> StreamingEngine:
        """The engine as a StreamingEngine (made once, by roles.rollout.engine's config)."""
        if self.streamer is None:
            if self.make_streamer is None:
                raise ValueError("fl.buffer(stream=True): this rollout role was built without a streaming engine")
            self.streamer = self.make_streamer(self.engine)
        return self.streamer

    @graph_method(kind="sync")
    def sync_weights(self, batch: TensorDict) -> TensorDict:
        """Hybrid engine: bring the source's latest weights into the rollout engine."""
        if self.source is not None and self.weight_sync is not None and self.synced_version != self.source.version:
            self.weight_sync(self.source.engine, self.engine)
            self.synced_version = self.source.version
        return batch

    def load_weight_stream(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Weights streamed from the source's process (the executor syncs split pools this way)."""
        self.engine.load_weight_stream(named_tensors)
        self.synced_version = version

    def close(self) -> None:
        """The run is over: release the streamer made from the engine, if any, and the engine
        (flowrl.graph.role.close_role)."""
        if self.service is not None:
            self.service.close()
        if self.streamer is not None:
            self.streamer.close()
        self.engine.close()
