"""One run per output folder: `train.output_dir/.flowrl.lock`, held with fcntl.flock while the run lives.

The kernel drops the lock when its process ends, however it ends (kill -9 included), so a stale lock cannot
exist; the file only records the holder (pid, host, start time) for the refusal line. A forked child (a data
set's scoring process) would share the lock's open file and keep it past the run's death, so every child
closes its copy at fork. The lock file is opened with O_NOFOLLOW: a symlink planted there is refused. flock works on local
file systems; on NFS it depends on the server (Linux clients map it to byte-range locks).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

LOCK = ".flowrl.lock"


class RunLock:
    """The output folder's lock; `acquire` refuses in one line naming the holder."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / LOCK
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            raise ValueError(f"train.output_dir {str(self.path.parent)!r}: {LOCK} cannot be opened ({err.strerror}"
                             f"{'; it is a symlink, which flowrl never follows' if self.path.is_symlink() else ''})"
                             ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise ValueError(f"train.output_dir {str(self.path.parent)!r} is in use by another run ({holder}); "
                             f"wait for it to end or use another output_dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode())
        self._fd = fd
        _HELD.add(fd)
        return self

    def release(self) -> None:
        if self._fd is not None:
            _HELD.discard(self._fd)
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


_HELD: set[int] = set()  # the descriptors of the locks this process holds


def _close_in_child() -> None:
    for fd in _HELD:
        try:
            os.close(fd)  # the child's copy only: the parent's keeps the lock
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        return f"pid {info['pid']} on host {info['host']}, since {since}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"
