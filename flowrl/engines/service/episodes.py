"""The calls an agent episode made through the endpoint, and the training row they become.

The endpoint (flowrl.engines.service.endpoint) records every call of an episode as token ids: the prompt it
sampled from, the response, the sampler's logprob and the policy version of each response token. Nothing is
decoded and re-encoded: the row holds exactly the tokens that were sampled.

An episode becomes one row. Its calls chain when each call's prompt starts with the previous call's prompt and
response (a chat client that sends the whole conversation back, through a template that re-renders earlier
turns unchanged); the row is then

    first prompt | response 1 (loss 1) | what the client added (tool results, user turns: loss 0) | response 2 ...

A call whose prompt does not extend the chain (the client rewrote the history, or a template re-rendered an
earlier turn differently) starts the chain anew: the row keeps the last chain, the one that holds the final
answer, and the earlier calls count in `agent/unchained_calls` (their tokens are not trained on).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from flowrl.engines.protocols import FinishReason


@dataclass(frozen=True)
class Call:
    """One sampled response of an episode, as token ids."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    finish: FinishReason


@dataclass
class EpisodeTokens:
    """An episode's row: its prompt and response (model tokens and what the client added between them)."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    loss: list[int] = field(default_factory=list)  # 1 on sampled tokens, 0 on tokens the client added
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the policy version of each sampled token, -1 elsewhere
    finish: FinishReason = FinishReason.STOP
    unchained: int = 0  # calls left out of the row (see the module docstring)
    calls: int = 0

    def extend(self, call: Call) -> bool:
        """Adds `call` when its prompt extends this chain; False (nothing added) when it does not."""
        so_far = self.prompt + self.ids
        if list(call.prompt_ids[:len(so_far)]) != so_far:
            return False
        added = list(call.prompt_ids[len(so_far):])
        self._add(added, 0, [0.0] * len(added), [-1] * len(added))
        self._add(list(call.response_ids), 1, list(call.logprobs), list(call.versions))
        self.finish, self.calls = call.finish, self.calls + 1
        return True

    def _add(self, ids: list[int], loss: int, logprobs: list[float], versions: list[int]) -> None:
        self.ids += ids
        self.loss += [loss] * len(ids)
        self.logprobs += logprobs
        self.versions += versions


def episode_tokens(calls: list[Call], fallback_prompt: list[int]) -> EpisodeTokens:
    """The row of an episode's calls (see the module docstring); an episode without calls is `fallback_prompt`
    with an empty response."""
    if not calls:
        return EpisodeTokens(list(fallback_prompt))
    chain = EpisodeTokens(list(calls[0].prompt_ids))
    for call in calls:
        if not chain.extend(call):
            dropped = chain.calls + chain.unchained
            chain = EpisodeTokens(list(call.prompt_ids), unchained=dropped)
            chain.extend(call)
    return chain


class EpisodeBook:
    """The calls of each open episode, by id; thread-safe (the endpoint records from its own thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open_episodes: dict[str, list[Call]] = {}

    def open(self, episode: str) -> None:
        with self.lock:
            if episode in self.open_episodes:
                raise ValueError(f"episode {episode!r} is already open")
            self.open_episodes[episode] = []

    def is_open(self, episode: str) -> bool:
        with self.lock:
            return episode in self.open_episodes

    def record(self, episode: str, call: Call) -> bool:
        """Adds a call to an open episode; False when the episode is closed (its agent ran past its deadline)."""
        with self.lock:
            if episode not in self.open_episodes:
                return False
            self.open_episodes[episode].append(call)
            return True

    def count(self, episode: str) -> int:
        with self.lock:
            return len(self.open_episodes.get(episode, ()))

    def close(self, episode: str) -> list[Call]:
        """The episode's calls; later calls to it are refused."""
        with self.lock:
            return self.open_episodes.pop(episode, [])
