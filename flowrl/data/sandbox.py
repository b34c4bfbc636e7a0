"""Run untrusted Python (a model's tool call) in a subprocess with limits.

`run_python(code)` starts `python -I -S` (isolated: no site packages, no
user paths, no PYTHON* variables) in a new session and returns what it
printed, or a named error. Limits, each a one-line error when hit:

- time: `timeout_s` of wall clock (and as much CPU time), then the whole
  process group is killed: "timeout after 2.0s".
- memory: RLIMIT_AS of `memory_mb` (address space), so allocating past it
  raises MemoryError in the child: "out of memory (limit 256 MB)".
- output: stdout and stderr go to files capped by RLIMIT_FSIZE at
  `max_output_bytes` (the child is killed by SIGXFSZ when it writes past
  it, so megabytes of output never reach this process): "output over 4096
  bytes".
- network: an audit hook installed before the code runs refuses socket
  creation and connection, "network is disabled (socket.connect)", and any
  new process (so `curl` cannot stand in), "blocked: os.system"; where user namespaces are allowed the child also
  runs under `unshare -rn`, in a network namespace with no interfaces.
- a crash: the last line of the traceback, "ZeroDivisionError: division by
  zero", or the signal that ended it, "killed by SIGSEGV".

This is a sandbox for a model's mistakes, not for an adversary: run tools
that must contain hostile code in a container or a VM.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

PRELUDE = """
import sys
def _flowrl_guard(event, args, _blocked=("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn",
                                         "os.fork", "os.spawn", "ctypes.dlopen", "pty.spawn")):
    if event.startswith(_blocked):
        raise PermissionError("sandbox blocks " + event)
sys.addaudithook(_flowrl_guard)
del _flowrl_guard
"""


@dataclass(frozen=True)
class ToolResult:
    output: str  # what the code printed (stdout), decoded as UTF-8 with replacement
    error: str = ""  # "" on success, else one line naming what went wrong


def run_python(code: str, *, timeout_s: float = 2.0, memory_mb: int = 256,
               max_output_bytes: int = 4096) -> ToolResult:
    """Runs `code` in a sandboxed interpreter and returns its stdout or a named error."""
    with tempfile.TemporaryDirectory(prefix="flowrl-tool-") as tmp:
        out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            command = [*_no_network(), sys.executable, "-I", "-S", "-c", PRELUDE + code]
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=tmp,
                                    env={"PATH": os.defpath}, start_new_session=True,
                                    preexec_fn=functools.partial(_limits, timeout_s, memory_mb, max_output_bytes))
            try:
                code_ = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill(proc)
                return ToolResult("", f"timeout after {timeout_s:.1f}s")
        output = _read(out_path, max_output_bytes)
        stderr = _read(err_path, max_output_bytes)
    return ToolResult(output, _error(code_, stderr, output, memory_mb, max_output_bytes))


def _error(returncode: int, stderr: str, output: str, memory_mb: int, max_output_bytes: int) -> str:
    if returncode == -signal.SIGXFSZ or len(output.encode()) > max_output_bytes:
        return f"output over {max_output_bytes} bytes"
    if returncode == -signal.SIGXCPU:
        return "timeout (CPU time limit)"
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    if returncode == 0:
        return ""
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), f"exit {returncode}")
    if last.startswith("MemoryError"):
        return f"out of memory (limit {memory_mb} MB)"
    if "sandbox blocks" in last:
        event = last.rpartition("sandbox blocks ")[2]
        return f"network is disabled ({event})" if event.startswith("socket.") else f"blocked: {event}"
    return last[:200]


def _limits(timeout_s: float, memory_mb: int, max_output_bytes: int) -> None:
    """In the child, before exec: address space, CPU seconds, bytes written per file, no core dumps."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    cpu = max(1, int(timeout_s + 1))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_output_bytes + 1, max_output_bytes + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _read(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit + 1).decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=1)
def _no_network() -> tuple[str, ...]:
    """("unshare", "-rn") where this machine lets an unprivileged process make a network namespace, else ()."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    try:
        done = subprocess.run([unshare, "-rn", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return (unshare, "-rn") if done.returncode == 0 else ()
