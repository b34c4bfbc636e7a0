"""StreamWorker: the request bookkeeping that both streaming engines share (flowrl.engines.streaming.protocol).

One worker thread owns the batch engine; the asyncio side only queues requests and flags pauses. Each request
is a `Job`: its asyncio future (resolved on the caller's loop through `loop.call_soon_threadsafe`) and the
response so far (tokens, the sampler's logprobs, the version of each). A job is *new* until it has a token,
*started* after. Under the lock (`self.cond`):

- `queue`: jobs not running now: new ones, started ones between two calls (a chunked batch, a resume), and
  those a `pause(abort=True)` parked (`cut`: counted in `Sample.aborts` when they resume).
- `running`: the jobs the worker has handed to the engine.

What may run: everything while not paused; only started jobs while a `pause(abort=False)` drains (they finish
under the weights they started with, new ones wait); nothing after `pause(abort=True)` (the subclass's
`interrupt` cuts what runs; each job keeps its prefix). `pause` returns once nothing runs and nothing may run:
the weights may change then. Subclasses implement `work()` (one round in the worker thread: `take` jobs,
run them, `settle` each with what came back) and `interrupt()`.

Every wait has a deadline: the thread's start (`start_timeout_s`), `pause` (`pause_timeout_s`), `close`
(`close_timeout_s`); a worker that fails fails every job with its error, so no `await sample(...)` hangs on a
dead thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Callable

from flowrl.engines.protocols import FinishReason, SamplingParams
from flowrl.engines.sampling import check_sampling_params
from flowrl.engines.streaming.protocol import Request, Sample

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    """One request and the response sampled for it so far."""

    request: Request
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    aborts: int = 0
    cut: bool = False  # a pause(abort=True) stopped it with a prefix; it resumes from there

    @property
    def started(self) -> bool:
        return bool(self.ids)

    @property
    def budget(self) -> int:
        """Tokens it may still sample."""
        return self.request.params.max_new_tokens - len(self.ids)

    @property
    def prompt(self) -> list[int]:
        """What the engine continues: the prompt and the response so far."""
        return [*self.request.prompt_ids, *self.ids]

    @property
    def seed(self) -> int | None:
        """The request's seed, shifted by the tokens already sampled, so a continuation does not replay the
        noise its first tokens were drawn with."""
        return None if self.request.seed is None else self.request.seed + len(self.ids)

    def params(self, max_new_tokens: int | None = None) -> SamplingParams:
        return replace(self.request.params, max_new_tokens=max_new_tokens or self.budget)


def _post(job: Job, outcome: Sample | BaseException) -> None:
    """Resolves the job's future on its own event loop (from any thread); nothing if that loop is gone."""
    if not job.loop.is_closed():
        job.loop.call_soon_threadsafe(_resolve, job.future, outcome)


def _resolve(future: asyncio.Future, outcome: Sample | BaseException) -> None:
    if future.done():  # the caller gave up (cancelled)
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class StreamWorker:
    """StreamingEngine plumbing over one worker thread; see the module docstring."""

    def __init__(self, *, name: str, version: int = 0, start_timeout_s: float = 60.0, pause_timeout_s: float = 600.0,
                 close_timeout_s: float = 60.0, poll_s: float = 0.05):
        for option, value in dict(start_timeout_s=start_timeout_s, pause_timeout_s=pause_timeout_s,
                                  close_timeout_s=close_timeout_s, poll_s=poll_s).items():
            if not value > 0:
                raise ValueError(f"{option} must be > 0, got {value}")
        self.version = version
        self.pause_timeout_s, self.close_timeout_s, self.poll_s = pause_timeout_s, close_timeout_s, poll_s
        self.cond = threading.Condition()
        self.queue: list[Job] = []
        self.running: list[Job] = []
        self.paused = self.draining = self.closed = False
        self.error: BaseException | None = None
        started = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(started,), name=name, daemon=True)
        self.thread.start()
        if not started.wait(start_timeout_s):
            raise TimeoutError(f"{name}'s worker thread did not start within {start_timeout_s:g} s (start_timeout_s)")

    # the asyncio side

    async def sample(self, request: Request) -> Sample:
        """The finished response to `request` (raises the worker's error if it failed)."""
        check_sampling_params(request.params)
        job = Job(request, asyncio.get_running_loop(), asyncio.get_running_loop().create_future())
        with self.cond:
            self._check_alive()
            self.queue.append(job)
            self.cond.notify_all()
        return await job.future

    async def pause(self, abort: bool = False) -> None:
        """New requests wait; in-flight ones finish (abort=False) or stop with their prefix (abort=True).
        Returns once nothing runs, or raises TimeoutError after `pause_timeout_s`."""
        with self.cond:
            self._check_alive()
            self.paused, self.draining = True, not abort
            if abort:
                for job in self.queue + self.running:
                    job.cut = job.cut or job.started or job in self.running
                if self.running:
                    self.interrupt()
            self.cond.notify_all()
        await asyncio.to_thread(self._wait_idle)

    def resume(self, version: int) -> None:
        """The engine holds weights of `version` now: waiting and parked requests run (new tokens record it)."""
        with self.cond:
            self.version, self.paused, self.draining = version, False, False
            for job in self.queue:
                if job.cut:
                    job.aborts, job.cut = job.aborts + job.started, False
            self.cond.notify_all()

    def close(self) -> None:
        """Stops the worker thread (what runs is cut) and fails the requests left; the batch engine stays open."""
        with self.cond:
            if self.closed:
                return
            self.closed = True
            if self.running:
                self.interrupt()
            self.cond.notify_all()
        self.thread.join(self.close_timeout_s)
        if self.thread.is_alive():
            raise TimeoutError(f"{self.thread.name}'s worker thread did not stop within {self.close_timeout_s:g} s "
                               f"(close_timeout_s)")
        self._fail_all(RuntimeError(f"{self.thread.name} was closed before this request finished"))

    # the worker side (subclasses)

    def work(self) -> None:
        """One round in the worker thread: take jobs, run them, settle them."""
        raise NotImplementedError

    def interrupt(self) -> None:
        """Called under the lock while jobs run: cut them soon (each keeps its prefix)."""

    def finish_work(self) -> None:
        """Called in the worker thread as it ends (after close or a failure)."""

    def take(self, pick: Callable[[list[Job]], list[Job]], wait: bool = True) -> tuple[list[Job], int]:
        """Moves the jobs `pick` chooses among those that may run now into `running`, and the version they run
        under; waits (up to poll_s) when none may run and `wait`."""
        with self.cond:
            eligible = self._eligible()
            if not eligible and wait:
                self.cond.wait(self.poll_s)
                eligible = self._eligible()
            chosen = pick(eligible) if eligible else []
            for job in chosen:
                self.queue.remove(job)
                self.running.append(job)
            return chosen, self.version

    def settle(self, job: Job, ids: list[int], logprobs: list[float], version: int,
               finish: FinishReason | None) -> None:
        """Appends what the engine sampled for `job` under `version`; resolves it when `finish` is a reason or
        the budget is spent, else queues it to continue (first in line)."""
        assert len(ids) == len(logprobs) <= job.budget, (len(ids), len(logprobs), job.budget)
        with self.cond:
            self.running.remove(job)
            job.ids += ids
            job.logprobs += logprobs
            job.versions += [version] * len(ids)
            if finish is None and job.budget == 0:
                finish = FinishReason.LENGTH
            if finish is None:
                self.queue.insert(0, job)
            else:
                sample = Sample(job.request, job.ids, job.logprobs, job.versions, finish, job.aborts)
                _post(job, sample)
            self.cond.notify_all()

    def fail(self, job: Job, err: BaseException) -> None:
        """Fails one running job with `err` (its own fault, e.g. a prompt the engine refuses); the rest go on."""
        with self.cond:
            self.running.remove(job)
            self.cond.notify_all()
        _post(job, err)

    @property
    def stopping(self) -> bool:
        """True once the jobs running should stop: after pause(abort=True) or close()."""
        with self.cond:
            return self.closed or (self.paused and not self.draining)

    # internals

    def _eligible(self) -> list[Job]:
        """The queued jobs that may run now (under the lock); drops those their callers cancelled."""
        self.queue = [job for job in self.queue if not job.future.done()]
        if self.closed or self.paused and not self.draining:
            return []
        return [job for job in self.queue if not self.paused or job.started]

    def _main(self, started: threading.Event) -> None:
        started.set()
        try:
            while not self.closed:
                self.work()
        except BaseException as err:  # noqa: BLE001 - every waiting request learns why
            log.exception("%s failed", self.thread.name)
            with self.cond:
                self.error = err
                self.cond.notify_all()
            self._fail_all(err)
        finally:
            self.finish_work()

    def _wait_idle(self) -> None:
        with self.cond:
            idle = self.cond.wait_for(lambda: self.error is not None or not self.running and not self._eligible(),
                                      self.pause_timeout_s)
            self._check_alive()
        if not idle:
            raise TimeoutError(f"{self.thread.name}: requests still in flight after {self.pause_timeout_s:g} s of "
                               f"pause (pause_timeout_s)")

    def _check_alive(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"{self.thread.name}'s worker failed: {self.error!r}") from self.error
        if self.closed:
            raise RuntimeError(f"{self.thread.name} is closed")

    def _fail_all(self, err: BaseException) -> None:
        with self.cond:
            jobs, self.queue, self.running = self.queue + self.running, [], []
        for job in jobs:
            _post(job, err)
