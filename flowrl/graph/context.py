"""Which step and which call of a role method is running, for roles that seed per call.

Executors open a `StepCalls` per step and run each role-method node inside
`calling(...)`; a rollout then seeds its sampler from (seed, step, call), so
a step samples the same whether its nodes run in this process or in Ray
workers, and a resumed run samples what the uninterrupted one did.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import Counter
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class CallInfo:
    step: int = 0
    call: int = 1  # 1-based: how many calls of this role method this step has made, this one included


_CURRENT: contextvars.ContextVar[CallInfo] = contextvars.ContextVar("flowrl_call", default=CallInfo())


def current_call() -> CallInfo:
    """The running call's step and call number (step 0, call 1 outside an executor)."""
    return _CURRENT.get()


@contextlib.contextmanager
def calling(info: CallInfo) -> Iterator[None]:
    token = _CURRENT.set(info)
    try:
        yield
    finally:
        _CURRENT.reset(token)


class StepCalls:
    """Numbers each call of a role method within one step."""

    def __init__(self, step: int):
        self.step = step
        self._counts: Counter[tuple[str, str]] = Counter()

    def next(self, role: str, method: str) -> CallInfo:
        self._counts[role, method] += 1
        return CallInfo(self.step, self._counts[role, method])
