"""Lockstep: one streamed replica spanning k ranks (tensor parallel), every rank stepping the same requests.

vLLM's `external_launcher` runs one engine per rank of a tensor-parallel group, each with its own scheduler;
their forwards meet in collectives, so every rank must add, abort and step exactly the same requests in the same
order (as the batch `generate` gathers its rows: flowrl.engines.vllm.process.gather_rows). The replica's rank 0,
the *leader*, owns the request queue (a SteppedStreamer over a `LeaderCore`, flowrl.engines.streaming.stepped);
its k - 1 *followers* (`Follower`) only echo it:

- the leader applies each add and abort to its own core at once and records it; a step sends the recorded ops
  and "step" as one `Message` over the replica's own process group (`replica_group`), then steps;
- a follower receives each message, applies its ops in order, steps if told, and drops the results: only the
  leader returns samples;
- while the leader has nothing to step it sends what it recorded (e.g. a pause's aborts) and, every
  `beat_s`, an empty message, so a follower's receive never waits past the group's deadline;
- `pause` ends with a message marked "pause" (after the leader is idle): the followers stop listening, so a
  weight update finds no rank inside a collective of this group; `resume` starts them listening again (the
  followers first, or the leader's next message waits for them); `close` ends with "close".

A replica starts paused on every rank (the first `resume` starts it), so the first weight sync also finds the
followers idle. The messages travel with `torch.distributed.broadcast_object_list` from the leader: over a
gloo subgroup on CPU, an NCCL one (the objects staged on the current GPU) on CUDA, by the switch the reshard
uses (`flowrl.engines.weights.reshard.Exchange.on`). Each message is plain data (token ids, flowrl's
SamplingParams, seeds): a follower builds the engine's own request from it exactly as the leader did.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from flowrl.engines.protocols import SamplingParams
from flowrl.engines.streaming.stepped import Delta, StepCore
from flowrl.engines.weights.reshard import Exchange
from flowrl.engines.weights.reshard_plan import check_layout

BEAT_S = 1.0  # an idle leader's empty message, this often
GROUP_TIMEOUT_S = 300.0  # a collective of the replica's group that waits longer fails (a dead peer)


@dataclass(frozen=True)
class Add:
    request_id: str
    prompt: tuple[int, ...]
    params: SamplingParams
    seed: int | None


@dataclass(frozen=True)
class Abort:
    request_ids: tuple[str, ...]


@dataclass(frozen=True)
class Message:
    """Ops to apply in order, then one step if `step`; `end`: "pause" or "close" stops the follower after."""

    ops: tuple[Add | Abort, ...] = ()
    step: bool = False
    end: str | None = None


def replica_group(size: int, device: str, timeout_s: float = GROUP_TIMEOUT_S) -> Any:
    """This rank's replica group: None for a replica of one rank; else the world split into consecutive groups
    of `size` ranks (vLLM's external launcher: replicas outermost, tensor ranks innermost; one line if `size`
    does not divide the world), on Exchange.on(device)'s backend. Every rank calls it at the same point."""
    if size == 1:
        return None
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    check_layout(world, size)
    group, _ = dist.new_subgroups(group_size=size, backend=Exchange.on(device).backend,
                                  timeout=timedelta(seconds=timeout_s))
    return group


class Channel:
    """Broadcasts Messages from the group's rank 0 (see the module docstring)."""

    def __init__(self, group: Any, device: str = "cpu"):
        self.group, exchange = group, Exchange.on(device)
        self.device = None  # gloo: the objects stay on the CPU; NCCL: staged on this rank's GPU (any thread's)
        if exchange.backend == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.src = dist.get_global_rank(group, 0)
        self.leader = dist.get_rank(group) == 0

    def send(self, message: Message) -> None:
        assert self.leader
        dist.broadcast_object_list([message], src=self.src, group=self.group, device=self.device)

    def receive(self) -> Message:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=self.src, group=self.group, device=self.device)
        assert isinstance(box[0], Message), type(box[0])
        return box[0]


class LeaderCore:
    """The leader's StepCore: `core`'s own, with every add, abort and step sent to the followers."""

    def __init__(self, core: StepCore, channel: Channel, beat_s: float = BEAT_S):
        self.core, self.channel, self.beat_s = core, channel, beat_s
        self.lock = threading.Lock()  # the worker thread and pause's caller both send
        self.ops: list[Add | Abort] = []
        self.listening = False  # the followers wait for messages (from resume to pause or close)
        self.sent = 0.0

    def add(self, request_id: str, prompt: list[int], params: SamplingParams, seed: int | None) -> None:
        self.core.add(request_id, prompt, params, seed)  # a refused request raises here and is not sent
        with self.lock:
            self.ops.append(Add(request_id, tuple(prompt), params, seed))

    def abort(self, request_ids: list[str]) -> None:
        self.core.abort(request_ids)
        with self.lock:
            self.ops.append(Abort(tuple(request_ids)))

    def step(self) -> list[Delta]:
        self._send(step=True)
        return self.core.step()

    def idle(self) -> None:
        if self.ops or time.monotonic() - self.sent > self.beat_s:
            self._send()

    def resume(self) -> None:
        with self.lock:
            self.listening = True

    def pause(self) -> None:
        self._send(end="pause")

    def close(self) -> None:
        try:
            self._send(end="close")
        finally:
            self.core.close()

    def _send(self, step: bool = False, end: str | None = None) -> None:
        with self.lock:
            if not self.listening:
                assert not step, "a tensor-parallel replica steps only between resume and pause"
                return  # the followers stopped listening: what is recorded went with the last message
            self.channel.send(Message(tuple(self.ops), step, end))
            self.ops, self.sent = [], time.monotonic()
            self.listening = end is None


class Follower:
    """A follower rank's side of a replica: a StreamingEngine that samples nothing itself; a thread applies the
    leader's messages to `core` from each `resume` until the leader's "pause" or "close". `steps` records each
    step's ops (what a test compares with the leader's)."""

    def __init__(self, core: StepCore, channel: Channel, *, version: int = 0, pause_timeout_s: float = 600.0,
                 close_timeout_s: float = 60.0, record: bool = False):
        self.core, self.channel, self.version = core, channel, version
        self.pause_timeout_s, self.close_timeout_s = pause_timeout_s, close_timeout_s
        self.steps: list[Message] | None = [] if record else None
        self.cond = threading.Condition()
        self.listening = self.closed = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="flowrl-follower", daemon=True)
        self.thread.start()

    async def sample(self, request: Any) -> Any:
        raise RuntimeError("a tensor-parallel follower rank samples nothing: send requests to its replica's leader")

    async def pause(self, abort: bool = False) -> None:
        """Returns once the leader's "pause" arrived (the leader pauses first)."""
        await asyncio.to_thread(self._wait_quiet, self.pause_timeout_s, "pause")

    def resume(self, version: int) -> None:
        with self.cond:
            self._check_alive()
            self.version, self.listening = version, True
            self.cond.notify_all()

    def close(self) -> None:
        """Returns once the leader's "close" arrived, or at once if not listening."""
        self._wait_quiet(self.close_timeout_s, "close")
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join(self.close_timeout_s)

    def _main(self) -> None:
        try:
            if self.channel.device is not None:
                torch.cuda.set_device(self.channel.device)  # the current device is per thread
            while True:
                with self.cond:
                    self.cond.wait_for(lambda: self.listening or self.closed)
                    if self.closed:
                        return
                end = self._listen()
                with self.cond:
                    self.listening, self.closed = False, end == "close"
                    self.cond.notify_all()
        except BaseException as err:  # noqa: BLE001 - pause and close report it
            with self.cond:
                self.error, self.listening = err, False
                self.cond.notify_all()

    def _listen(self) -> str:
        while True:
            message = self.channel.receive()
            for op in message.ops:
                if isinstance(op, Add):
                    self.core.add(op.request_id, list(op.prompt), op.params, op.seed)
                else:
                    self.core.abort(list(op.request_ids))
            if message.step:
                self.core.step()  # the leader returns the samples
            if self.steps is not None and (message.ops or message.step):
                self.steps.append(message)
            if message.end is not None:
                return message.end

    def _wait_quiet(self, timeout_s: float, what: str) -> None:
        with self.cond:
            quiet = self.cond.wait_for(lambda: not self.listening, timeout_s)
            self._check_alive()
        if not quiet:
            raise TimeoutError(f"a tensor-parallel follower rank got no {what} from its leader within {timeout_s:g} s")

    def _check_alive(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"a tensor-parallel follower rank failed: {self.error!r}") from self.error
