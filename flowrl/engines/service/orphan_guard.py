"""A child process group that ends with the process that started it, however that process ends (kill -9 too).

`guarded(command)` is `command` behind a small guard: `python .../orphan_guard.py PARENT -- command` (standard library
only, so it starts at once).
Started with `start_new_session=True` (as flowrl starts a vLLM server), the guard leads the new process group,
runs `command` in it and watches PARENT's pid; once PARENT is gone it sends the group SIGTERM, then SIGKILL after
`GRACE_S`. Without it, a trainer that died before calling the engine's close() left the server holding its GPU
memory (2026-12-06, H100: a failed local run left vLLM's server with 41 GiB, and the next run ran out of
memory). The guard exits with the command's exit status, so a caller that polls it sees the command's, and a
caller's killpg of the group reaches the command too. (PR_SET_PDEATHSIG would fire when the starting *thread*
ends, and flowrl starts servers from worker threads, so the parent's pid is watched instead, as the scoring
pool's workers do.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE_S = 10.0
EVERY_S = 0.5


def guarded(command: list[str], parent: int | None = None) -> list[str]:
    """`command` run under the guard, which ends its group once `parent` (this process by default) is gone."""
    # run as a file, not `-m`: a module path would import flowrl.engines (torch) before the command starts
    return [sys.executable, os.path.abspath(__file__), str(parent or os.getpid()), "--", *command]


def end_group(grace_s: float = GRACE_S) -> None:
    """SIGTERM to this process's group, SIGKILL to what is left after `grace_s`; the guard itself goes too."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM is for the command
    group = os.getpgrp()
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)


def watch(parent: int, command: list[str]) -> int:
    child = subprocess.Popen(command)
    while True:
        code = child.poll()
        if code is not None:
            return code
        if os.getppid() != parent:
            end_group()
            return 1
        time.sleep(EVERY_S)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python orphan_guard.py PARENT_PID -- COMMAND...", file=sys.stderr)
        return 2
    return watch(int(argv[0]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
