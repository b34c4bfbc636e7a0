"""SpreadRunner: one streamed rollout over R replicas, each a runner of its own (StreamRunner in this process,
flowrl.runtime.offpolicy.stream_runner; or RemoteRunner in a rollout worker, flowrl.runtime.ray.streaming).

The driver's Streamer (flowrl.runtime.offpolicy.streaming) sees one runner. Each prompt group goes whole to one replica
(its n samples share that replica's prefix cache): the one with the fewest groups outstanding (submitted and not
yet returned; ties to the lowest index). A group's requests are seeded by its draw and row alone
(Rollout.requests), so on a deterministic engine the rows do not depend on the replica that sampled them or on
how many replicas there are. `finished` polls every replica at once (one call each per round, in threads, at
most `poll_s` a round) until `wanted` groups are back or the deadline passes; `pause`, `resume` and `close` reach
every replica at once, so a weight update pauses them all before it and resumes them all at one version after.
A replica spanning several ranks (tensor parallel) is one `ReplicaRunner` over its ranks' runners.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Protocol, Sequence

from tensordict import TensorDict

from flowrl.runtime.offpolicy.stream_runner import Group


class Runner(Protocol):
    def settings(self) -> tuple[bool, float, int]: ...

    def submit(self, batch: TensorDict, draw: int, n: int, sampling: dict[str, Any],
               rows: list[int] | None = None) -> None: ...

    def finished(self, wanted: int, timeout_s: float) -> tuple[list[Group], int]: ...

    def pause(self, abort: bool) -> int: ...

    def resume(self, version: int) -> None: ...

    def close(self) -> None: ...


class SpreadRunner:
    """The runner protocol over `runners`, one per replica (see the module docstring)."""

    def __init__(self, runners: Sequence[Runner], poll_s: float = 0.05):
        if not runners:
            raise ValueError("a spread rollout needs at least one replica")
        self.runners, self.poll_s = list(runners), poll_s
        self.outstanding = [0] * len(self.runners)
        self.threads = ThreadPoolExecutor(len(self.runners), thread_name_prefix="flowrl-replica")

    def settings(self) -> tuple[bool, float, int]:
        return self.runners[0].settings()

    def submit(self, batch: TensorDict, draw: int, n: int, sampling: dict[str, Any],
               rows: list[int] | None = None) -> None:
        shares: list[list[int]] = [[] for _ in self.runners]
        for row in range(batch.batch_size[0]) if rows is None else rows:
            least = min(range(len(self.runners)), key=lambda i: (self.outstanding[i], i))
            shares[least].append(row)
            self.outstanding[least] += 1
        self.each(lambda runner, share: runner.submit(batch, draw, n, sampling, share) if share else None, shares)

    def finished(self, wanted: int, timeout_s: float) -> tuple[list[Group], int]:
        deadline, out = time.monotonic() + timeout_s, []
        while True:
            left = deadline - time.monotonic()
            wait_s = min(max(left, 0.0), self.poll_s) if len(out) < wanted else 0.0
            rounds = self.each(lambda runner, _: runner.finished(1 if wait_s else 0, wait_s))
            for index, (groups, _) in enumerate(rounds):
                self.outstanding[index] -= len(groups)
                out += groups
            if len(out) >= wanted or time.monotonic() >= deadline:
                return sorted(out, key=lambda g: (g.draw, g.index)), sum(flying for _, flying in rounds)

    def pause(self, abort: bool) -> int:
        return sum(self.each(lambda runner, _: runner.pause(abort)))

    def resume(self, version: int) -> None:
        self.each(lambda runner, _: runner.resume(version))

    def close(self) -> None:
        try:
            self.each(lambda runner, _: runner.close())
        finally:
            self.threads.shutdown(wait=False)

    def each(self, call: Callable[[Runner, Any], Any], args: Sequence[Any] | None = None) -> list[Any]:
        """call(runner, arg) for every replica at once, in order; the first error is raised after all return."""
        futures = [self.threads.submit(call, runner, None if args is None else args[i])
                   for i, runner in enumerate(self.runners)]
        return [future.result() for future in futures]


class ReplicaRunner:
    """One replica spanning several ranks (tensor parallel, flowrl.engines.streaming.lockstep), as one runner:
    requests go to the leader's runner only; `settings` makes every rank's runner (each rank's part of the
    replica), `resume` starts the followers before the leader (its next message waits for them), `pause` and
    `close` reach the leader first (it tells the followers) and then the followers (which return once told)."""

    def __init__(self, leader: Runner, followers: Sequence[Runner]):
        self.leader, self.followers = leader, list(followers)

    def settings(self) -> tuple[bool, float, int]:
        for follower in self.followers:
            follower.settings()
        return self.leader.settings()

    def submit(self, batch: TensorDict, draw: int, n: int, sampling: dict[str, Any],
               rows: list[int] | None = None) -> None:
        self.leader.submit(batch, draw, n, sampling, rows)

    def finished(self, wanted: int, timeout_s: float) -> tuple[list[Group], int]:
        return self.leader.finished(wanted, timeout_s)

    def pause(self, abort: bool) -> int:
        ready = self.leader.pause(abort)
        for follower in self.followers:
            follower.pause(abort)
        return ready

    def resume(self, version: int) -> None:
        for follower in self.followers:
            follower.resume(version)
        self.leader.resume(version)

    def close(self) -> None:
        try:
            self.leader.close()
        finally:
            for follower in self.followers:
                follower.close()
