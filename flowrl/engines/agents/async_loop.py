"""The multi-turn agent loop over a StreamingEngine: one coroutine per episode.

flowrl.engines.agents.loop plays its episodes turn by turn: every running episode's turn in one batch
`generate`, then every step, so a turn waits for its slowest sample and its slowest tool. Here each episode
is a coroutine of its own:

    sample = await engine.sample(Request(prompt + response so far, max_new_tokens = min(per turn, budget left)))
    step = await the environment's step, in a daemon thread of its own (within step_timeout_s)

so while one episode's tool runs, the engine samples the other episodes' turns, and an episode never waits
for another's. The rows are those of `run_episodes` (the same fields, rewards, finish reasons, budget and
observation cuts, timeouts: the episode helpers are agent_loop's), plus `token_versions` [B, R]: the policy
version that sampled each turn token (Sample.versions; -1 on observations and padding), which says how stale
a row is when weights change while episodes play.

A step past `step_timeout_s` ends its episode with reward 0 and the tool error "environment step timed out
after N s"; its thread is abandoned (a daemon) and the other episodes go on. A sample past `sample_timeout_s`
(roles.rollout.stream_timeout_s) is not the episode's fault but a hung engine: the call raises one
TimeoutError line naming the setting and cancels the other episodes (verl's and OpenRLHF's loops fail the
run). At most `env_workers` steps run at once (0: one at a time); a step's deadline starts when it starts.

`run_episodes_async(...)` runs the episodes on a fresh event loop (asyncio.run) for a synchronous caller
(the rollout role); from a running loop, `await play_episodes(...)`. The timings are wall time: seconds in
which at least one sample (`timing_s/generate`) or one step (`timing_s/env`) was in flight; they overlap.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any, Sequence

import torch
from tensordict import TensorDict

from flowrl.data.multiturn.envs import Environment, EnvStep
from flowrl.engines.agents.loop import Episode, cut_by_budget, episodes_result, observe_step, step_thread, time_out
from flowrl.engines.protocols import FinishReason, SamplingParams
from flowrl.engines.streaming.protocol import Request, StreamingEngine


def run_episodes_async(engine: StreamingEngine, envs: Sequence[Environment], prompts: Sequence[Sequence[int]],
                       params: SamplingParams, *, max_turns: int, max_total_tokens: int, pad_id: int,
                       seed: int | None = None, step_timeout_s: float | None = None,
                       env_workers: int = 8,
                       sample_timeout_s: float | None = None) -> tuple[TensorDict, dict[str, Any]]:
    """`run_episodes`'s rows and stats (and `token_versions`) for one episode per (reset) environment, the
    episodes played concurrently on a fresh event loop; a synchronous call (see `play_episodes`)."""
    return asyncio.run(play_episodes(engine, envs, prompts, params, max_turns=max_turns,
                                     max_total_tokens=max_total_tokens, pad_id=pad_id, seed=seed,
                                     step_timeout_s=step_timeout_s, env_workers=env_workers,
                                     sample_timeout_s=sample_timeout_s))


async def play_episodes(engine: StreamingEngine, envs: Sequence[Environment], prompts: Sequence[Sequence[int]],
                        params: SamplingParams, *, max_turns: int, max_total_tokens: int, pad_id: int,
                        seed: int | None = None, step_timeout_s: float | None = None,
                        env_workers: int = 8,
                       sample_timeout_s: float | None = None) -> tuple[TensorDict, dict[str, Any]]:
    """The episodes as coroutines on the running loop; returns what `run_episodes_async` does."""
    if env_workers < 0:
        raise ValueError(f"roles.rollout.env_workers must be >= 0, got {env_workers}")
    episodes = [_Played(Episode(env, list(prompt))) for env, prompt in zip(envs, prompts)]
    loop = _Loop(engine, params, max_turns, max_total_tokens, seed, step_timeout_s,
                 asyncio.Semaphore(max(1, env_workers)), sample_timeout_s)
    tasks = [asyncio.ensure_future(loop.play(played, row)) for row, played in enumerate(episodes)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:  # a hung engine (or a step's error): the other episodes stop too
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    out, stats = episodes_result([p.episode for p in episodes], pad_id, loop.timing())
    out["token_versions"] = _versions([p.versions for p in episodes], out["response_ids"].shape[1])
    return out, stats


class _Played:
    """An episode and the policy version of each of its response tokens (-1 on observations)."""

    def __init__(self, episode: Episode) -> None:
        self.episode, self.versions = episode, []

    def align(self) -> None:
        self.versions += [-1] * (len(self.episode.ids) - len(self.versions))


class _Busy:
    """Wall time during which at least one of the things it wraps is in flight (a counter, on the loop's thread)."""

    def __init__(self) -> None:
        self.seconds, self.running, self.since = 0.0, 0, 0.0

    def __enter__(self) -> None:
        if self.running == 0:
            self.since = time.perf_counter()
        self.running += 1

    def __exit__(self, *exc: object) -> None:
        self.running -= 1
        if self.running == 0:
            self.seconds += time.perf_counter() - self.since


class _Loop:
    """What every episode's coroutine shares: the engine, the limits, the step slots and the timings."""

    def __init__(self, engine: StreamingEngine, params: SamplingParams, max_turns: int, max_total_tokens: int,
                 seed: int | None, step_timeout_s: float | None, slots: asyncio.Semaphore,
                 sample_timeout_s: float | None = None) -> None:
        self.engine, self.params, self.max_turns, self.max_total_tokens = engine, params, max_turns, max_total_tokens
        self.seed, self.step_timeout_s, self.slots = seed, step_timeout_s, slots
        self.sample_timeout_s = sample_timeout_s
        self.generating, self.stepping = _Busy(), _Busy()

    def timing(self) -> dict[str, float]:
        return {"generate": self.generating.seconds, "env": self.stepping.seconds}

    async def play(self, played: _Played, row: int) -> None:
        """Plays one episode to its end (or max_turns: episodes_result then marks it MAX_TURNS)."""
        episode = played.episode
        for turn in range(self.max_turns):
            left = self.max_total_tokens - len(episode.ids)
            request = Request(tuple(episode.prompt + episode.ids),
                              replace(self.params, max_new_tokens=min(self.params.max_new_tokens, left)),
                              seed=None if self.seed is None else (self.seed + 7_919 * turn + 104_729 * row) % 2**31)
            with self.generating:
                sample = await self._sample(request)
            episode.add(sample.response_ids[:left], 1, sample.logprobs[:left])
            played.versions += sample.versions[:left]
            episode.turns += 1
            if cut_by_budget(len(sample.response_ids), left, self.params.max_new_tokens, sample.finish):
                episode.finish = FinishReason.MAX_TOKENS  # not sent to the environment
                return
            async with self.slots:
                with self.stepping:
                    step = await _step(episode.env, list(sample.response_ids), self.step_timeout_s)
            if step is None:
                time_out(episode, self.step_timeout_s)
            else:
                observe_step(episode, step, self.max_total_tokens)
            played.align()
            if episode.finish is not None:
                return


    async def _sample(self, request: Request) -> Any:
        """engine.sample(request) within sample_timeout_s; past it one TimeoutError line naming the setting."""
        try:
            return await asyncio.wait_for(self.engine.sample(request), self.sample_timeout_s)
        except TimeoutError:
            raise TimeoutError(f"async agent loop: the rollout engine returned no sample within "
                               f"roles.rollout.stream_timeout_s={self.sample_timeout_s}s") from None


async def _step(env: Environment, turn_ids: list[int], timeout_s: float | None) -> EnvStep | None:
    """env.step(turn_ids) off the loop, in a daemon thread of its own; None when it ran past `timeout_s` (the
    thread is abandoned). What the step raises is raised here."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[EnvStep] = loop.create_future()

    def settle(step: EnvStep | None, error: BaseException | None) -> None:
        if future.done():  # the deadline passed first
            return
        future.set_exception(error) if error is not None else future.set_result(step)

    def done(step: EnvStep | None, error: BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(settle, step, error)
        except RuntimeError:  # the loop has closed: the step was abandoned long ago
            pass

    step_thread(env, turn_ids, done)
    try:
        return await asyncio.wait_for(future, timeout_s)
    except TimeoutError:
        return None


def _versions(versions: list[list[int]], width: int) -> torch.Tensor:
    """token_versions [B, width]: each row's versions, -1 on padding."""
    out = torch.full((len(versions), width), -1, dtype=torch.long)
    for i, row in enumerate(versions):
        out[i, :len(row)] = torch.tensor(row, dtype=torch.long)
    return out
