"""The multi-turn agent loop over any RolloutEngine: token ids in, token ids out.

Each row is one episode. A turn generates for every episode still running in
one `engine.generate` call, its context the prompt followed by everything so
far as token ids (left-padded; nothing is decoded and re-encoded, so the
context is exactly what was sampled and observed). The sampled turn (through
its eos, or `max_new_tokens` long) goes to the row's environment, whose
observation ids are appended after it. The row's response is everything after
the prompt:

    prompt | turn 1 (loss 1) | observation 1 (loss 0) | turn 2 (loss 1) | ...

`response_mask` is 1 on all of it, `loss_mask` only on the model's own
tokens, and `rollout_logprobs` holds the sampler's logprob of each turn token
(0 on observations). An episode ends when the environment says done
(FinishReason.STOP), after `max_turns` turns (MAX_TURNS) or when the response
reaches `max_total_tokens` (MAX_TOKENS): a turn is cut to the budget left and
not sent to the environment (a turn that fills the budget exactly without its eos
counts as cut), an observation is cut to it.

A step has a deadline, `step_timeout_s` (`roles.rollout.env_step_timeout_s`): it
runs in a daemon thread of its own, waited for that long. A step past it ends
its episode (FinishReason.STOP) with the reward 0 and the tool error
"environment step timed out after N s", counted in `env/timed_out` (and in
`env/tool_error_rate`); the other episodes go on. A Python thread cannot be
killed, so the hung step's thread is abandoned (a daemon: it does not keep
the process alive) and its environment is never stepped again. A turn's
steps share `env_workers` threads, so a turn ends within ceil(hung steps /
workers) x the deadline.

flowrl.engines.agents.async_loop plays the same episodes over a StreamingEngine, one coroutine each, with
these helpers.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch
from tensordict import TensorDict

from flowrl import metrics
from flowrl.data.batch import left_pad, right_pad
from flowrl.data.multiturn.envs import Environment, EnvStep
from flowrl.engines.protocols import FinishReason, RolloutEngine, SamplingParams


@dataclass
class Episode:
    env: Environment
    prompt: list[int]
    ids: list[int] = field(default_factory=list)  # the response so far: turns and observations
    loss: list[int] = field(default_factory=list)  # 1 on turn tokens, 0 on observation tokens
    logprobs: list[float] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    tool_calls: int = 0  # steps that returned an observation
    error: str = ""  # the first tool error (or the step's timeout, which ended the episode)
    timed_out: bool = False  # a step ran past step_timeout_s
    finish: FinishReason | None = None

    def add(self, ids: Sequence[int], loss: int, logprobs: Sequence[float] | None = None) -> None:
        self.ids += list(ids)
        self.loss += [loss] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)


def run_episodes(engine: RolloutEngine, envs: Sequence[Environment], prompts: Sequence[Sequence[int]],
                 params: SamplingParams, *, max_turns: int, max_total_tokens: int, pad_id: int,
                 seed: int | None = None, pool: ThreadPoolExecutor | None = None,
                 step_timeout_s: float | None = None) -> tuple[TensorDict, dict[str, Any]]:
    """Runs one episode per (reset) environment; returns the rows' response fields (and `scores`, the summed
    rewards, `num_turns`) and per-row tool errors, tool calls and timings. With `pool` the environments of a
    turn step in its threads (tools wait on subprocesses); a step past `step_timeout_s` (None: no deadline)
    ends its episode with reward 0."""
    episodes = [Episode(env, list(prompt)) for env, prompt in zip(envs, prompts)]
    timing = {"generate": 0.0, "env": 0.0}
    for turn in range(max_turns):
        active = [e for e in episodes if e.finish is None]
        if not active:
            break
        room = [max_total_tokens - len(e.ids) for e in active]
        turn_params = replace(params, max_new_tokens=min(params.max_new_tokens, max(room)))
        ids_BP, mask_BP = left_pad([e.prompt + e.ids for e in active], pad_id)
        start = time.perf_counter()
        out = engine.generate(ids_BP, mask_BP, turn_params, seed=None if seed is None else seed + 7_919 * turn)
        timing["generate"] += time.perf_counter() - start
        lengths, finishes = out["response_mask"].sum(-1).tolist(), out["finish_reason"].tolist()
        start = time.perf_counter()
        sent = []
        for row, (episode, left) in enumerate(zip(active, room)):
            n = lengths[row]
            turn_ids = out["response_ids"][row, :n].tolist()
            episode.add(turn_ids[:left], 1, out["rollout_logprobs"][row, :min(n, left)].tolist())
            episode.turns += 1
            if cut_by_budget(n, left, params.max_new_tokens, finishes[row]):  # not sent to the environment
                episode.finish = FinishReason.MAX_TOKENS
            else:
                sent.append((episode, turn_ids))
        steps = pool.map(lambda item: _step_within(item[0].env, item[1], step_timeout_s), sent) if pool else \
            [_step_within(episode.env, turn_ids, step_timeout_s) for episode, turn_ids in sent]
        for (episode, _), step in zip(sent, steps):
            if step is None:
                time_out(episode, step_timeout_s)
            else:
                observe_step(episode, step, max_total_tokens)
        timing["env"] += time.perf_counter() - start
    return episodes_result(episodes, pad_id, timing)


def cut_by_budget(n: int, left: int, max_new_tokens: int, finish: int) -> bool:
    """Whether a turn of n tokens, with `left` tokens of the episode's budget, was cut by the budget: it is
    longer, or exactly as long and stopped by a length limit the budget set (not by its eos)."""
    return n > left or (n == left < max_new_tokens and finish != FinishReason.STOP)


def episodes_result(episodes: list[Episode], pad_id: int,
                    timing: dict[str, float]) -> tuple[TensorDict, dict[str, Any]]:
    """The rows and stats of finished episodes (those still running reached max_turns)."""
    for episode in episodes:
        episode.finish = episode.finish if episode.finish is not None else FinishReason.MAX_TURNS
    metrics.log("env/timed_out", sum(e.timed_out for e in episodes))
    return _rows(episodes, pad_id), _stats(episodes, timing)


def step_thread(env: Environment, turn_ids: list[int],
                done: Callable[[EnvStep | None, BaseException | None], None]) -> threading.Thread:
    """Starts env.step(turn_ids) in a daemon thread of its own (abandoned if it hangs: a thread cannot be
    killed), which calls done(step, None), or done(None, what the step raised)."""
    def run() -> None:
        try:
            step = env.step(turn_ids)
        except BaseException as err:  # handed to the caller as it was raised
            done(None, err)
            return
        done(step, None)

    thread = threading.Thread(target=run, daemon=True, name="flowrl-env-step")
    thread.start()
    return thread


def _step_within(env: Environment, turn_ids: list[int], timeout_s: float | None) -> EnvStep | None:
    """env.step(turn_ids), or None when it did not return within `timeout_s` (its thread is abandoned). What
    the step raises is raised here."""
    if timeout_s is None:
        return env.step(turn_ids)
    box: dict[str, Any] = {}
    thread = step_thread(env, turn_ids, lambda step, error: box.update(step=step, error=error))
    thread.join(timeout_s)
    if thread.is_alive():
        return None
    if box["error"] is not None:
        raise box["error"]
    return box["step"]


def time_out(episode: Episode, timeout_s: float | None) -> None:
    """Ends an episode whose step hung: reward 0, the timeout as its tool error; its environment is never stepped again."""
    episode.reward, episode.timed_out, episode.finish = 0.0, True, FinishReason.STOP
    episode.error = f"environment step timed out after {timeout_s:g} s"


def observe_step(episode: Episode, step: EnvStep, max_total_tokens: int) -> None:
    """Takes the environment's step: its reward, its error, and its observation cut to the budget left."""
    episode.reward += float(step.reward)
    episode.error = episode.error or step.error
    if step.done:
        episode.finish = FinishReason.STOP
        return
    episode.tool_calls += 1
    left = max_total_tokens - len(episode.ids)
    episode.add(list(step.observation_ids)[:left], 0)
    if len(step.observation_ids) >= left:
        episode.finish = FinishReason.MAX_TOKENS


def _rows(episodes: list[Episode], pad_id: int) -> TensorDict:
    rows = len(episodes)
    ids, mask = right_pad([e.ids for e in episodes], pad_id)
    loss = right_pad([e.loss for e in episodes], 0)[0]
    logprobs = right_pad([e.logprobs for e in episodes], 0.0, torch.float32)[0]
    return TensorDict(response_ids=ids, response_mask=mask, loss_mask=loss, rollout_logprobs=logprobs,
                      finish_reason=torch.tensor([int(e.finish) for e in episodes]),
                      scores=torch.tensor([e.reward for e in episodes], dtype=torch.float32),
                      num_turns=torch.tensor([e.turns for e in episodes]), batch_size=[rows])


def _stats(episodes: list[Episode], timing: dict[str, float]) -> dict[str, Any]:
    return {"tool_error": [e.error for e in episodes], "tool_calls": [e.tool_calls for e in episodes],
            "timing_s/generate": timing["generate"], "timing_s/env": timing["env"]}
