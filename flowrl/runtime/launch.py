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
