"""`flowrl ARGS` in a process of its own, without paying for its imports each time.

A `python -m flowrl` costs about 7 s of CPU in imports (torch, transformers,
tensordict) before it parses its arguments. Here each run is a child forked from
one server process that imported the CLI and the trainer once (multiprocessing's
forkserver); in all else it is a fresh process: its own stdout and stderr, exit
status, working folder and environment, and SIGKILL ends it as it would the CLI.
Import-time output is not seen here: tests that run the real `python -m flowrl`
(test_reliability's finished-run check, test_spmd, test_train_e2e's train call)
keep that covered. START_METHOD gives torch.multiprocessing's ranks the same
server (test_engine_fsdp2.spawn_and_join).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

START_METHOD = "forkserver"
_CONTEXT = multiprocessing.get_context(START_METHOD)
_CONTEXT.set_forkserver_preload(["flowrl.cli", "flowrl.runtime.trainer"])


def _main(args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """The child: `flowrl.cli.main(args)` with fds 1 and 2 on the files `out` and `err`; exits with its status."""
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    from flowrl.cli import main

    try:
        code = main(args)
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    except BaseException:  # noqa: BLE001  (--debug re-raises: the interpreter would print it and exit 1)
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def start(args: list[str], cwd: str | Path, env: dict[str, str] | None = None,
          out: str = os.devnull, err: str = os.devnull) -> multiprocessing.Process:
    """Starts `flowrl *args` in `cwd` (env: this process's environment); returns the running process."""
    proc = _CONTEXT.Process(target=_main, args=(list(args), str(cwd), dict(os.environ if env is None else env),
                                                out, err))
    proc.start()
    return proc


def stall_until(done: list[Path], longest: float) -> None:
    """A rank that never takes part: it stays (as a stuck rank would) until the other ranks wrote their results
    `done`, having given up on it, or `longest` s at most; its exit earlier would close their pairs to it."""
    deadline = time.monotonic() + longest
    while not all(path.exists() for path in done) and time.monotonic() < deadline:
        time.sleep(0.05)


def run(*args: str, cwd: str | Path, env: dict[str, str] | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess:
    """`flowrl *args` to its end, as subprocess.run(..., capture_output=True, text=True) gives it."""
    with tempfile.TemporaryDirectory() as folder:
        out, err = os.path.join(folder, "out"), os.path.join(folder, "err")
        proc = start(list(args), cwd, env, out, err)
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired(["flowrl", *args], timeout)
        return subprocess.CompletedProcess(["flowrl", *args], proc.exitcode, Path(out).read_text(),
                                           Path(err).read_text())
