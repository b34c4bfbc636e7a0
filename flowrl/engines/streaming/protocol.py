"""Streaming rollouts: an engine that takes requests one by one and answers each when its sample finishes.

The batch `RolloutEngine.generate` waits for its slowest row. A `StreamingEngine` is asyncio-native: each
`await engine.sample(request)` resolves when that one response is done, so a group completes as soon as its
own samples arrive and an agent episode (one coroutine) steps its tool while other episodes generate.

Weights change between `pause` and `resume`:

- `await engine.pause(abort=False)`: the requests in flight finish under the weights they started with
  (their tokens record that version), new requests wait; returns once nothing is in flight.
- `await engine.pause(abort=True)` (partial rollouts, `roles.rollout.partial=true`): the requests in flight
  stop where they are; each keeps its prefix (tokens, the sampler's logprobs, versions).
- `engine.resume(version)`: the engine now holds weights of `version`; waiting requests start, and aborted
  ones continue from their prefix (prompt + prefix as the new prompt, the token budget left), so one sample
  can hold tokens of two versions: `Sample.versions` has one entry per token.

Every token keeps the sampler's logprob of it under the version that sampled it, which is what the
rollout correction (flowrl.rl.correction) weighs against.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Protocol

from flowrl.engines.protocols import FinishReason, SamplingParams

_ids = itertools.count()


@dataclass(frozen=True)
class Request:
    """One response to sample for `prompt_ids` (unpadded token ids)."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    seed: int | None = None
    id: str = field(default_factory=lambda: f"r{next(_ids)}")
    key: str | None = None  # affinity: requests of one key (a prompt group, an episode) go to one replica


@dataclass
class Sample:
    """A finished response: its tokens, the sampler's logprob of each and the policy version that sampled each."""

    request: Request
    response_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish: FinishReason
    aborts: int = 0  # times a weight update cut it and it resumed from its prefix

    def __post_init__(self) -> None:
        assert len(self.response_ids) == len(self.logprobs) == len(self.versions), \
            (len(self.response_ids), len(self.logprobs), len(self.versions))

    @property
    def min_version(self) -> int:
        return min(self.versions, default=-1)

    @property
    def max_version(self) -> int:
        return max(self.versions, default=-1)


class StreamingEngine(Protocol):
    """Samples requests one by one (see the module docstring)."""

    version: int  # the policy version of the weights it holds

    async def sample(self, request: Request) -> Sample: ...

    async def pause(self, abort: bool = False) -> None: ...

    def resume(self, version: int) -> None: ...

    def close(self) -> None: ...
