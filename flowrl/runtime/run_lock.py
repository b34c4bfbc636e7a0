"""One run per output folder: `train.output_dir/.flowrl.lock`, held with fcntl.flock while the run lives.

The kernel drops the lock when its process ends, however it ends (kill -9 included), so a stale lock cannot
exist; the file only records the holder (pid, host, start time) for the refusal line. flock works on local
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
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        return f"pid {info['pid']} on host {info['host']}, since {since}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"
