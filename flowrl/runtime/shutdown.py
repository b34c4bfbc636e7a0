"""SIGTERM and SIGINT stop a run at its next safe point: the end of the step in progress, with a checkpoint.

Schedulers send SIGTERM some seconds before SIGKILL; Ctrl-C sends SIGINT. Either one asks the loop to stop
after the step it is in: it saves a checkpoint and ends with one line saying where (Stopped, exit status
128 + the signal's number from the CLI). Should no safe point come within checkpoint.shutdown_timeout_s, the
process exits with a line saying so; the previous checkpoint is intact (a checkpoint folder appears whole
or not at all). A second signal does not wait: Ctrl-C raises KeyboardInterrupt at once, SIGTERM exits.
Under torchrun every rank gets the signal; the ranks agree after each step, so they stop at the same one.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

from flowrl.runtime import distributed

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """The run stopped on a signal at a safe point; `exit_code` is 128 + the signal's number."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class Shutdown:
    """A context that turns SIGTERM and SIGINT into a request the loop reads with `requested()`."""

    def __init__(self, timeout_s: float):
        self.timeout_s, self.signum, self.pid = timeout_s, None, os.getpid()
        self._previous: dict[int, Any] = {}
        self._timer: threading.Timer | None = None

    def __enter__(self) -> "Shutdown":
        if threading.current_thread() is threading.main_thread():  # Python allows handlers only there
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._timer is not None:
            self._timer.cancel()

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def requested(self) -> bool:
        """Whether any rank got a signal (collective under torchrun: every rank calls it after each step)."""
        return distributed.mean_over_ranks({"stop": float(self.signum is not None)})["stop"] > 0

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.pid:  # a forked child (a scorer) inherits the handler: the trainer speaks and stops
            return
        if self.signum is not None:  # the second one: no more waiting
            if signum == signal.SIGINT:
                raise KeyboardInterrupt("a second Ctrl-C; the last checkpoint is intact")
            _exit(f"a second {signal.Signals(signum).name}: exiting now; the last checkpoint is intact", signum)
        self.signum = signum
        if os.environ.get("RANK", "0") == "0":  # torchrun signals every rank: one says it
            print(f"flowrl: {self.name}: stopping after this step with a checkpoint (within "
                  f"checkpoint.shutdown_timeout_s={self.timeout_s:g})", file=sys.stderr, flush=True)
        self._timer = threading.Timer(self.timeout_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        _exit(f"{self.name}: no safe point within checkpoint.shutdown_timeout_s={self.timeout_s:g}; exiting without a "
              f"new checkpoint (the last one is intact; rerun the same command to resume from it)", self.signum)


def exit_now(code: int) -> None:
    """Ends the process after a stop on a signal, its checkpoint saved: stdio flushed and the atexit callbacks
    run (Ray's and the loggers' shutdowns), the interpreter's teardown skipped. That teardown frees every module
    and object, 1-2 s of CPU for a tiny run, and under load it took most of the 33-61 s that sft, rm and
    streamed runs needed from SIGTERM to exit against the 25 s budget (threads still running are not waited for
    either: a scheduler's SIGKILL follows)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _exit(message: str, signum: int) -> None:
    print(f"flowrl: {message}", file=sys.stderr, flush=True)
    os._exit(128 + signum)
