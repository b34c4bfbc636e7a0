"""Router: one StreamingEngine over R replica StreamingEngines (flowrl.engines.streaming.protocol).

Each request goes to one replica:

- the replica that already served its *affinity key* (`Request.key`: a prompt group's uid, or an agent
  episode's id), so a group's samples and a conversation's turns reuse that replica's prefix cache, unless
  that replica holds `slack` more requests in flight than the least loaded one;
- otherwise the least loaded replica (fewest requests in flight; ties to the lowest index).

A weight update reaches all of them: `pause(abort)` pauses every replica at once (the requests in flight
finish, or stop with their prefix under `abort=True`), `resume(version)` resumes every one at that version.
The keys a router remembers are forgotten on `resume`: weights changed, and so did every cached prefix.

`router.in_flight` (per replica) and `router.routed` (requests sent to each replica so far) are what the
metrics `rollout/replica_<i>/requests` report (flowrl.runtime.offpolicy).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Sequence

from flowrl.engines.streaming.protocol import Request, Sample, StreamingEngine


class Router:
    """Least-loaded routing with affinity over replica StreamingEngines (see the module docstring)."""

    def __init__(self, replicas: Sequence[StreamingEngine], *, slack: int = 4, max_keys: int = 65536):
        if not replicas:
            raise ValueError("a router needs at least one replica")
        if slack < 0:
            raise ValueError(f"router slack must be >= 0, got {slack}")
        self.replicas = list(replicas)
        self.slack, self.max_keys = slack, max_keys
        self.in_flight = [0] * len(self.replicas)
        self.routed = [0] * len(self.replicas)
        self.keys: OrderedDict[str, int] = OrderedDict()  # affinity key -> replica, oldest first

    @property
    def version(self) -> int:
        return min(replica.version for replica in self.replicas)

    def pick(self, key: str | None) -> int:
        """The replica for a request with affinity `key` (None: none), by the rule of the module docstring."""
        least = min(range(len(self.replicas)), key=lambda i: (self.in_flight[i], i))
        if key is not None and key in self.keys:
            mine = self.keys[key]
            if self.in_flight[mine] <= self.in_flight[least] + self.slack:
                self.keys.move_to_end(key)
                return mine
        if key is not None:
            self.keys[key] = least
            self.keys.move_to_end(key)
            while len(self.keys) > self.max_keys:
                self.keys.popitem(last=False)
        return least

    async def sample(self, request: Request) -> Sample:
        index = self.pick(request.key)
        self.in_flight[index] += 1
        self.routed[index] += 1
        try:
            return await self.replicas[index].sample(request)
        finally:
            self.in_flight[index] -= 1

    async def pause(self, abort: bool = False) -> None:
        await asyncio.gather(*(replica.pause(abort=abort) for replica in self.replicas))

    def resume(self, version: int) -> None:
        self.keys.clear()
        for replica in self.replicas:
            replica.resume(version)

    def close(self) -> None:
        errors = []
        for replica in self.replicas:
            try:
                replica.close()
            except Exception as err:  # close every replica; report the first failure after
                errors.append(err)
        if errors:
            raise errors[0]
