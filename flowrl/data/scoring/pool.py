"""Batched scoring in worker processes with a per-sample timeout.

Workers resolve scorers by name themselves (a scorer loaded from a file path
needs no pickling). A sample that runs past the timeout scores 0.0 and is
counted in a warning; its worker is killed and replaced, so a hung scorer
never blocks the batch or the next one. An exception in a scorer stops the run with one line
naming the sample and the scorer.
"""

from __future__ import annotations

import contextvars
import logging
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
import weakref
from collections import deque
from multiprocessing.connection import wait
from dataclasses import dataclass
from typing import Any

from flowrl import metrics
from flowrl.data.scoring.scorers import resolve

log = logging.getLogger(__name__)

MAX_ABS_REWARD = 1e6
"""A reward beyond this (or inf, nan) is a broken scorer, not a signal: the run stops naming the sample."""


def check_reward(value: float, where: str) -> float:
    """`value`, or a ValueError naming `where` (the scorer and the row) when it is not finite or absurd."""
    if not math.isfinite(value) or abs(value) > MAX_ABS_REWARD:
        raise ValueError(f"reward {value!r} for {where}: rewards must be finite and within +-{MAX_ABS_REWARD:g} "
                         f"(flowrl.data.scoring.pool.MAX_ABS_REWARD)")
    return value


@dataclass(frozen=True)
class Sample:
    scorer: str
    data_source: str
    response: str
    ground_truth: str
    extra_info: Any
    where: str  # "train.parquet row 3", for errors


def score_one(sample: Sample) -> tuple[bool, float | str]:
    """(True, score) or (False, "ErrorType: message"); never raises, so the parent names the sample."""
    try:
        score = float(resolve(sample.scorer)(data_source=sample.data_source, solution_str=sample.response,
                                             ground_truth=sample.ground_truth, extra_info=sample.extra_info))
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # the user's scorer: any failure (sys.exit too) is reported with the sample
        return False, f"{type(err).__name__}: {err}"
    return True, score


class ScoringPool:
    """Scores samples with `num_workers` processes (0: in this process, no timeout: a scorer that hangs there
    hangs the run; use workers for scorers you do not trust to return).

    Each worker scores one sample at a time, so a sample's deadline counts from when a worker took it; a
    worker past it is killed (SIGKILL: a scorer cannot ignore it) and replaced, and the sample scores 0.0.
    A batch therefore ends within ceil(len / num_workers) * timeout_s, whatever its scorer does."""

    def __init__(self, num_workers: int = 4, timeout_s: float = 10.0):
        self.num_workers, self.timeout_s = num_workers, timeout_s
        self._workers: list[_Worker] = []

    def score(self, samples: list[Sample]) -> list[float]:
        if self.num_workers == 0:
            return [self._check(s, score_one(s)) for s in samples]
        if not self._workers:
            self._workers = [_Worker() for _ in range(self.num_workers)]
            weakref.finalize(self, _kill_all, self._workers)  # a task dropped without close() leaves none behind
        scores, todo, timed_out = [0.0] * len(samples), deque(range(len(samples))), 0
        results: dict[int, tuple[bool, float | str]] = {}
        while todo or any(w.index is not None for w in self._workers):
            for w in self._workers:
                if w.index is None and todo:
                    w.take(todo.popleft(), samples, self.timeout_s)
            busy = [w for w in self._workers if w.index is not None]
            wait([w.conn for w in busy], timeout=max(0.0, min(w.deadline for w in busy) - time.monotonic()))
            for n, w in enumerate(self._workers):
                if w.index is None:
                    continue
                if w.conn.poll():
                    i = w.index
                    results[i] = w.result()
                elif time.monotonic() >= w.deadline:
                    w.kill()
                    self._workers[n] = _Worker()
                    timed_out += 1
        for i in sorted(results):  # checked in row order: the first bad row is the one named, whichever worker
            scores[i] = self._check(samples[i], results[i])  # finished first
        metrics.log("reward/timed_out", float(timed_out))
        if timed_out:
            log.warning("reward: %d of %d samples ran past data.reward_timeout_s=%g and scored 0.0 (their "
                        "scoring processes were killed and replaced)", timed_out, len(samples), self.timeout_s)
        return scores

    def _check(self, sample: Sample, result: tuple[bool, float | str]) -> float:
        ok, value = result
        if not ok:
            self.close()
            raise ValueError(f"reward scorer {sample.scorer!r} failed on {sample.where} "
                             f"(response {sample.response[:80]!r}): {value}")
        try:
            return check_reward(float(value), f"{sample.where} from scorer {sample.scorer!r}")
        except ValueError:
            self.close()
            raise

    def close(self) -> None:
        _kill_all(self._workers)
        self._workers = []

    def __getstate__(self) -> dict[str, Any]:  # a task travels to Ray workers without its processes
        return {**self.__dict__, "_workers": []}


# fork: workers start in milliseconds and see scorers the parent imported; spawn where fork is absent
_CONTEXT = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")


class _Worker:
    """One scoring process and its pipe; `index` is the sample it is scoring (None: idle)."""

    def __init__(self) -> None:
        self.conn, child = _CONTEXT.Pipe()
        self.process = _CONTEXT.Process(target=_serve, args=(child, os.getpid()), daemon=True, name="flowrl-scorer")
        self.process.start()
        child.close()
        self.index: int | None = None
        self.deadline = 0.0

    def take(self, index: int, samples: list[Sample], timeout_s: float) -> None:
        self.conn.send(samples[index])
        self.index, self.deadline = index, time.monotonic() + timeout_s

    def result(self) -> tuple[bool, float | str]:
        self.index = None
        try:
            return self.conn.recv()
        except EOFError:  # the scorer took its process down (a crash, the OOM killer)
            self.process.join()
            return False, f"its scoring process died (exit code {self.process.exitcode})"

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()


def _serve(conn: Any, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    threading.Thread(target=_exit_with, args=(parent,), daemon=True, name="flowrl-orphan-watch").start()
    while True:
        try:
            sample = conn.recv()
        except EOFError:
            return
        conn.send(score_one(sample))


def _exit_with(parent: int, every_s: float = 0.5) -> None:
    """Ends this scoring process once the trainer `parent` is gone (kill -9 included), even while a scorer
    hangs: an orphan would live on holding the run's files. (PR_SET_PDEATHSIG fires when the forking *thread*
    ends, and workers are forked from the reward's deadline thread, so the parent's pid is watched instead.)"""
    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(1)


def _kill_all(workers: list[_Worker]) -> None:
    for w in workers:
        w.kill()


def call_with_deadline(fn: Any, args: tuple[Any, ...], timeout_s: float | None, what: str,
                       timed_out: str | None = None) -> Any:
    """fn(*args) in a daemon thread, waited for at most `timeout_s` (None: for ever): a function that never
    returns stops the run with a TimeoutError naming `what` (or saying `timed_out`), instead of hanging it (the
    thread is abandoned)."""
    if timeout_s is None:
        return fn(*args)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as err:  # handed to the caller's thread as it was raised
            box["error"] = err

    context = contextvars.copy_context()  # metrics.log in `fn` reaches this step's metrics
    thread = threading.Thread(target=context.run, args=(run,), daemon=True, name="flowrl-reward")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(timed_out or f"{what} did not return within {timeout_s:g} s; the run stops here (rerun "
                           f"the same command to resume from the last checkpoint)")
    if "error" in box:
        raise box["error"]
    return box["value"]
