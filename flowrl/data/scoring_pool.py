"""Batched scoring in a process pool with a per-sample timeout.

Workers resolve scorers by name themselves (a scorer loaded from a file path
needs no pickling). A sample that runs past the timeout scores 0.0 and is
counted in a warning; the pool is then replaced, so a hung worker never
blocks the next batch. An exception in a scorer stops the run with one line
naming the sample and the scorer.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import sys
import weakref
from dataclasses import dataclass
from typing import Any

from flowrl.data.scorers import resolve

log = logging.getLogger(__name__)

MAX_ABS_REWARD = 1e6
"""A reward beyond this (or inf, nan) is a broken scorer, not a signal: the run stops naming the sample."""


def check_reward(value: float, where: str) -> float:
    """`value`, or a ValueError naming `where` (the scorer and the row) when it is not finite or absurd."""
    if not math.isfinite(value) or abs(value) > MAX_ABS_REWARD:
        raise ValueError(f"reward {value!r} for {where}: rewards must be finite and within +-{MAX_ABS_REWARD:g} "
                         f"(flowrl.data.scoring_pool.MAX_ABS_REWARD)")
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
    except Exception as err:  # the user's scorer: any failure is reported with the sample
        return False, f"{type(err).__name__}: {err}"
    return True, score


class ScoringPool:
    """Scores samples with `num_workers` processes (0: in this process, no timeout)."""

    def __init__(self, num_workers: int = 4, timeout_s: float = 10.0):
        self.num_workers, self.timeout_s = num_workers, timeout_s
        self._pool: Any = None

    def score(self, samples: list[Sample]) -> list[float]:
        if self.num_workers == 0:
            return [self._check(s, score_one(s)) for s in samples]
        pool = self._pool = self._pool or self._start()
        pending = [pool.apply_async(score_one, (s,)) for s in samples]
        scores, timed_out = [], 0
        for sample, result in zip(samples, pending):
            try:
                scores.append(self._check(sample, result.get(timeout=self.timeout_s)))
            except multiprocessing.TimeoutError:
                scores.append(0.0)
                timed_out += 1
        if timed_out:
            log.warning("reward: %d of %d samples ran past data.reward_timeout_s=%g and scored 0.0",
                        timed_out, len(samples), self.timeout_s)
            self.close()  # its hung workers would hold the next batch
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

    def _start(self) -> Any:
        # fork: workers start in milliseconds and see scorers the parent imported; spawn where fork is absent
        method = "fork" if sys.platform == "linux" else "spawn"
        pool = multiprocessing.get_context(method).Pool(self.num_workers)
        weakref.finalize(self, pool.terminate)  # a task dropped without close() leaves no workers behind
        return pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __getstate__(self) -> dict[str, Any]:  # a task travels to Ray workers without its pool
        return {**self.__dict__, "_pool": None}
