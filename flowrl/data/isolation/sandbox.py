"""Run untrusted Python (a model's tool call) isolated by the OS, with limits.

`run_python(code)` runs `python -I -S -c code` inside bubblewrap
(flowrl.data.isolation.bwrap): as uid nobody with no capabilities, no network, no
view of other processes or of the machine's files (only the interpreter,
/usr and a private /tmp, read-only but for /tmp), under a seccomp filter
(flowrl.data.isolation.seccomp), and every process it starts is killed when it ends. It returns what the code printed, or a
one-line error:

- time: `timeout_s` of wall clock (and as much CPU time per process), then
  the sandbox and all in it are killed: "timeout after 2.0s".
- memory: RLIMIT_AS of `memory_mb` per process, so allocating past it raises
  MemoryError: "out of memory (limit 256 MB)".
- output: stdout and stderr go to files capped by RLIMIT_FSIZE at
  `max_output_bytes` (the writer is killed by SIGXFSZ past it, so megabytes
  never reach this process): "output over 4096 bytes".
- processes: `max_processes` processes and threads at once (a fork bomb gets
  "Resource temporarily unavailable").
- code that cannot be run: a NUL byte ("code contains a NUL byte", as Python
  itself refuses such source) or over MAX_CODE_BYTES ("code over 131071
  bytes"), returned as the tool's error before any process starts.
- a crash: the last line of the traceback, "ZeroDivisionError: division by
  zero", or the signal that ended it, "killed by SIGSEGV".

Without bubblewrap the tool refuses with one line naming the install. With
`unsafe_no_sandbox=True` (roles.rollout.env_options) it runs the code as this
process's user, with these limits but no isolation: for a trusted machine
only, and it says so loudly.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import select
import signal
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from typing import IO

from flowrl.data.isolation import bwrap, seccomp

UNSAFE = ("unsafe_no_sandbox: model code runs WITHOUT the OS sandbox, as this process's user, able to read and "
          "change every file this user can (checkpoints included) and to signal the trainer; use only on a "
          "throw-away machine")


MAX_CODE_BYTES = 128 * 1024 - 1  # the kernel's limit on one exec argument (MAX_ARG_STRLEN, its NUL included)
SETUP_TIMEOUT_S = 30.0  # longest bwrap may take to set a sandbox up before the code's own timeout starts


@dataclass(frozen=True)
class ToolResult:
    output: str  # what the code printed (stdout), decoded as UTF-8 with replacement
    error: str = ""  # "" on success, else one line naming what went wrong


def check(where: str, unsafe: bool = False) -> None:
    """Refuses (ValueError, one line) when the sandbox cannot run here; warns when `unsafe` skips it."""
    if unsafe:
        warnings.warn(f"{where}: {UNSAFE}", UserWarning, stacklevel=2)
        return
    missing = bwrap.problem()
    if missing:
        raise ValueError(f"{where} needs {missing} (or roles.rollout.env_options={{'unsafe_no_sandbox': true}} runs "
                         f"model code unsandboxed)")


def run_python(code: str, *, timeout_s: float = 2.0, memory_mb: int = 256, max_output_bytes: int = 4096,
               max_processes: int = 16, unsafe_no_sandbox: bool = False) -> ToolResult:
    """Runs `code` in a sandboxed interpreter and returns its stdout or a named error."""
    limits = bwrap.Limits(timeout_s, memory_mb, max_output_bytes, max_processes)
    if not unsafe_no_sandbox:
        check("the python tool")
    refused = _unrunnable(code)
    if refused:
        return ToolResult("", refused)
    with tempfile.TemporaryDirectory(prefix="flowrl-tool-") as tmp:
        out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            run = _run_unsandboxed if unsafe_no_sandbox else _run_sandboxed
            returncode = run([bwrap.interpreter(), "-I", "-S", "-c", code], limits, out, err, tmp)
        if returncode is None:
            return ToolResult("", f"timeout after {timeout_s:.1f}s")
        output = _read(out_path, max_output_bytes)
        stderr = _read(err_path, max_output_bytes)
    return ToolResult(output, _error(returncode, stderr, output, limits, sandboxed=not unsafe_no_sandbox))


def _unrunnable(code: str) -> str:
    """The tool error for code no interpreter can be handed as its -c argument, or ""."""
    if "\0" in code:
        return "code contains a NUL byte"
    try:
        size = len(os.fsencode(code))  # as exec will be handed it
    except UnicodeEncodeError as e:
        return f"code holds a character that is not text ({e.reason} at {e.start})"
    return f"code over {MAX_CODE_BYTES} bytes" if size > MAX_CODE_BYTES else ""


def _run_sandboxed(argv: list[str], limits: bwrap.Limits, out: IO, err: IO, tmp: str) -> int | None:
    """bwrap's exit status, or None when it ran past the timeout and its pid namespace was killed whole."""
    info_read, info_write = os.pipe()
    filter_fd = seccomp.program_fd()
    try:
        with bwrap.uid_slot() as uid:
            proc = subprocess.Popen(bwrap.command(argv, limits, uid, info_write, filter_fd),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, env={"PATH": os.defpath},
                                    start_new_session=True, pass_fds=(info_write, filter_fd))
            os.close(info_write)
            info_write = -1
            sandbox_pid = _started(info_read)  # the timeout counts from here: a busy machine's setup is not the code's
            try:
                return proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_namespace(proc, sandbox_pid)
                return None
    finally:
        for fd in (info_read, info_write, filter_fd):
            if fd >= 0:
                os.close(fd)


def _started(info_read: int) -> int | None:
    """The host pid of the sandbox's pid 1, once bwrap has set it up and said so on the info pipe (None when bwrap
    failed first: the pipe closed empty, or it took over SETUP_TIMEOUT_S)."""
    ready, _, _ = select.select([info_read], [], [], SETUP_TIMEOUT_S)
    try:
        return int(json.loads(os.read(info_read, 65536))["child-pid"]) if ready else None
    except (ValueError, KeyError):
        return None


def _kill_namespace(proc: subprocess.Popen, sandbox_pid: int | None) -> None:
    """Kills the sandbox's pid 1: the kernel then kills every process in its pid namespace before bwrap sees it
    exit, so none is left when this returns."""
    if sandbox_pid is not None:
        try:
            os.kill(sandbox_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        _kill(proc)


def _run_unsandboxed(argv: list[str], limits: bwrap.Limits, out: IO, err: IO, tmp: str) -> int | None:
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=tmp,
                            env={"PATH": os.defpath}, start_new_session=True,
                            preexec_fn=functools.partial(_limits, limits))
    try:
        return proc.wait(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return None


def _error(returncode: int, stderr: str, output: str, limits: bwrap.Limits, sandboxed: bool) -> str:
    signum = -returncode if returncode < 0 else returncode - 128 if sandboxed and returncode > 128 else 0
    if signum == signal.SIGXFSZ or len(output.encode()) > limits.max_output_bytes:
        return f"output over {limits.max_output_bytes} bytes"
    if signum == signal.SIGXCPU:
        return "timeout (CPU time limit)"
    if signum in signal.valid_signals():
        return f"killed by {signal.Signals(signum).name}"
    if returncode == 0:
        return ""
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), f"exit {returncode}")
    if last.startswith("MemoryError"):
        return f"out of memory (limit {limits.memory_mb} MB)"
    return last[:200]


def _limits(limits: bwrap.Limits) -> None:
    """Unsafe mode, in the child before exec: the same rlimits as prlimit sets inside the sandbox."""
    cpu = int(limits.timeout_s) + 1
    for kind, value in ((resource.RLIMIT_AS, limits.memory_mb << 20), (resource.RLIMIT_CPU, cpu),
                        (resource.RLIMIT_FSIZE, limits.max_output_bytes + 1), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(kind, (value, value))


def _kill(proc: subprocess.Popen) -> None:
    """Kills the process group the call started (bwrap's pid 1 dies with bwrap: --die-with-parent)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _read(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit + 1).decode("utf-8", errors="replace")
