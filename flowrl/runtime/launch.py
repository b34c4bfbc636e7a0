"""`flowrl train --nproc-per-node N`: N ranks on this machine through torchrun's own launcher
(torch.distributed.launcher.api.elastic_launch), with nothing of torchrun's in the output.

`torchrun --nproc-per-node N -m flowrl train ...` works too, but torchrun adds its banner (OMP_NUM_THREADS) on
every start and, when a rank fails, a traceback of its own and a ~30-line failure table around the rank's one
line. Here the ranks print as under torchrun, the launcher prints nothing, and the exit code is the failing
rank's (2: bad input, 1: a failure, 128+N: stopped by signal N). The config is checked once before any rank
starts, so bad input is one line, said once. One machine only; several nodes: torchrun on each.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid

NPROC_FLAG = "--nproc-per-node"


def without_nproc(argv: list[str]) -> list[str]:
    """`argv` without `--nproc-per-node N` / `--nproc-per-node=N` (what every rank runs)."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == NPROC_FLAG:
            skip = True
        elif not word.startswith(f"{NPROC_FLAG}="):
            out.append(word)
    return out


def run_ranks(nproc: int, argv: list[str], timeout_s: float = 60.0) -> int:
    """Run `python -m flowrl ARGV` as `nproc` ranks (gloo or NCCL as the run's device says; rendezvous at
    127.0.0.1 on a free port, within `timeout_s`); the exit code of the first rank that failed, else 0."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, without its banner
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in list(logging.root.manager.loggerDict):  # the agent's lines on a failure ("Sending process ...")
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"flowrl-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                          rdzv_configs={"timeout": int(timeout_s), "rank": 0})
    try:
        elastic_launch(config, sys.executable)("-m", "flowrl", *argv)
    except ChildFailedError as err:
        _, failure = err.get_first_failure()
        return failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode  # -15: SIGTERM
    except SignalException as err:  # the launcher itself was stopped: the ranks got SIGTERM and have stopped
        return 128 + int(err.sigval)
    return 0


PEERS_SAID_S = 20.0  # how long a rank stopping on bad input waits for its peers to say theirs


def wait_for_peers_to_say(deadline_s: float = PEERS_SAID_S) -> int:
    """A rank of a launch (torchrun or `--nproc-per-node`) that stops on bad input waits, at most `deadline_s`,
    until every rank has reached this point too: the launcher ends the other ranks as soon as one exits, and a
    rank a few seconds behind (imports on a busy machine) was ended before it printed its own line. Counts in the
    launch's own store (MASTER_ADDR:MASTER_PORT, one key per restart); returns how many ranks had said it (1 where
    there is no launch, or its store cannot be reached)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 or "TORCHELASTIC_RUN_ID" not in os.environ or "MASTER_PORT" not in os.environ:
        return 1
    import time
    from datetime import timedelta

    from torch.distributed import TCPStore

    end = time.monotonic() + deadline_s
    try:
        store = TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"]),
                         is_master=False, timeout=timedelta(seconds=max(1.0, deadline_s)))
        key = f"flowrl/said/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        said = store.add(key, 1)
        while said < world and time.monotonic() < end:
            time.sleep(0.1)
            said = store.add(key, 0)
    except (RuntimeError, ValueError, OSError):  # no store: say it and go, as before
        return 1
    return said
