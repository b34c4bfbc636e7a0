"""The OS sandbox of the python tool: bubblewrap (bwrap) namespaces, an unprivileged uid and rlimits.

`command(argv, limits, uid, info_fd, seccomp_fd)` wraps an interpreter's argv so that it
runs

- as `uid` (and gid) with no capabilities and no supplementary groups:
  `uid_slot()` hands out 65534 (nobody), or while that one is in use by a
  concurrent call or by any process on the host, one of 65000-65533
  (reserved, never allocated by Debian),
  so that concurrent calls have separate process budgets (RLIMIT_NPROC counts
  a uid's processes); as root, bwrap keeps only CAP_SETUID/SETGID/SETPCAP for
  util-linux's `setpriv`, which drops to nobody, clears the bounding set and
  sets no_new_privs before the interpreter starts; as any other user, in a
  user namespace (`--uid`) where no further user namespace can be made;
- in new pid, network, ipc, uts and cgroup namespaces: it sees only its own
  processes (`/proc` is the new namespace's), has only a loopback device of
  its own, and when bwrap's reaper (pid 1) exits, the kernel kills every
  process left in the namespace (the caller kills that pid 1, named on
  `info_fd`, to end it all); `--die-with-parent` ends it with the caller;
- on an empty root with read-only binds of only what the interpreter needs:
  /usr (and the /bin, /lib* links or folders beside it), /etc/ld.so.cache,
  and the interpreter's own prefix with its site-packages hidden; a private
  /dev, and a private /tmp of `tmp_mb` (the working folder). No /etc, /root,
  /home, /work or run folder is there;
- under util-linux's `prlimit`: address space (`memory_mb`), CPU seconds,
  processes and threads (`max_processes`), bytes per written file (the
  output cap), open files, no core dumps;
- under the seccomp filter of flowrl.data.isolation.seccomp (`seccomp_fd`).

`problem()` says why this machine cannot (bwrap missing, or it cannot make
namespaces here), or "" when it can; it is probed once per bwrap path.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from flowrl.data.isolation import seccomp

NOBODY = 65534
INSTALL = "apt-get install bubblewrap"
_ROOT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")  # all setpriv needs to drop to nobody
_SPARE_UIDS = range(65533, 64999, -1)  # Debian's reserved uids, for calls beside one running as nobody
_in_use: set[int] = set()
_lock = threading.Lock()


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 2.0  # wall clock; CPU seconds are limited to this plus one
    memory_mb: int = 256  # address space of each process
    max_output_bytes: int = 4096  # bytes of any file it writes (its stdout and stderr are files)
    max_processes: int = 16  # processes and threads at once (RLIMIT_NPROC)
    tmp_mb: int = 16  # size of its private /tmp


def command(argv: list[str], limits: Limits, uid: int = NOBODY, info_fd: int | None = None,
            seccomp_fd: int | None = None) -> list[str]:
    """bwrap [namespaces, uid, mounts, seccomp] -- prlimit [limits] -- [setpriv, as root] argv."""
    fds = [*(["--info-fd", str(info_fd)] if info_fd is not None else []),
           *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else [])]
    return [_bwrap(), *fds, *_identity(uid), *_namespaces(), *_mounts(limits.tmp_mb), "--", *_prlimit(limits),
            *_drop_to(uid), *argv]


@contextlib.contextmanager
def uid_slot() -> Iterator[int]:
    """A uid no other sandbox of this process runs as while the block runs, and no process on the host runs as
    when it starts: nobody when free. RLIMIT_NPROC counts all of a uid's processes, so a host daemon running as
    nobody, or a process of an earlier call still exiting, would take from the call's budget (CI, 2026-12-04:
    a thread bomb right after a fork bomb could start no thread)."""
    running = _host_uids()  # read before the lock: concurrent calls do not wait on each other's scan of /proc
    with _lock:
        free = [u for u in (NOBODY, *_SPARE_UIDS) if u not in _in_use]
        uid = next((u for u in free if u not in running), free[0])
        _in_use.add(uid)
    try:
        yield uid
    finally:
        with _lock:
            _in_use.discard(uid)


def _host_uids() -> set[int]:
    """The owners of the processes this host's /proc shows (a process's /proc folder belongs to its uid)."""
    uids = set()
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit():
                try:
                    uids.add(entry.stat().st_uid)
                except OSError:  # it exited meanwhile
                    pass
    return uids


def interpreter() -> str:
    """The real path of this Python's binary (a venv's python is a link to it), which the sandbox binds."""
    return os.path.realpath(sys.executable)


@functools.lru_cache(maxsize=4)
def _probe(bwrap: str | None, setpriv: str | None, prlimit: str | None) -> str:
    if bwrap is None:
        return f"bubblewrap: {INSTALL}"
    if prlimit is None or (os.geteuid() == 0 and setpriv is None):
        return "util-linux's prlimit and setpriv: apt-get install util-linux"
    if not seccomp.available():
        return "libseccomp: apt-get install libseccomp2"
    filter_fd = seccomp.program_fd()
    try:
        with uid_slot() as uid:
            argv = command([interpreter(), "-I", "-S", "-c", "pass"], Limits(timeout_s=10), uid, None, filter_fd)
            done = subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL,
                                  pass_fds=(filter_fd,))
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"a working bubblewrap ({bwrap} failed: {err})"
    finally:
        os.close(filter_fd)
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"a working bubblewrap ({bwrap} failed here: {last[:200]})"
    return ""


def problem() -> str:
    """"" when the sandbox runs on this machine, else what it needs ("bubblewrap: apt-get install bubblewrap")."""
    return _probe(shutil.which("bwrap"), shutil.which("setpriv"), shutil.which("prlimit"))


def _bwrap() -> str:
    path = shutil.which("bwrap")
    assert path is not None, "problem() is checked before a sandbox starts"
    return path


def _identity(uid: int) -> list[str]:
    if os.geteuid() == 0:  # no user namespace: it would map the sandbox's uid to root outside
        return ["--cap-drop", "ALL", *(arg for cap in _ROOT_CAPS for arg in ("--cap-add", cap))]
    return ["--unshare-user", "--disable-userns", "--uid", str(uid), "--gid", str(uid)]


def _namespaces() -> list[str]:
    return ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup",
            "--die-with-parent", "--new-session", "--hostname", "sandbox",
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
            "--setenv", "MALLOC_ARENA_MAX", "1"]  # else each thread reserves a 64 MB arena of the address space


def _mounts(tmp_mb: int) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    if os.path.exists("/etc/ld.so.cache"):
        args += ["--perms", "0755", "--dir", "/etc", "--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    args += _python_prefix()
    return args + ["--proc", "/proc", "--dev", "/dev",
                   "--perms", "1777", "--size", str(tmp_mb << 20), "--tmpfs", "/tmp", "--chdir", "/tmp"]


def _python_prefix() -> list[str]:
    """The interpreter's prefix read-only at its own path (its library path is compiled in), parents 0755,
    its site-packages covered by an empty tmpfs (`python -S` does not read them; nothing else needs them)."""
    prefix = os.path.realpath(sys.base_prefix)
    assert interpreter().startswith(prefix + os.sep), f"{interpreter()} is not inside {prefix}"
    if prefix == "/usr" or prefix.startswith("/usr/"):
        args = []
    else:
        parents = [p for p in _parents(prefix) if p != "/"]
        args = [a for p in parents for a in ("--perms", "0755", "--dir", p)] + ["--ro-bind", prefix, prefix]
    hidden = {sysconfig.get_path(key, "posix_prefix", {"base": prefix, "platbase": prefix})
              for key in ("purelib", "platlib")}
    return args + [a for path in sorted(hidden) if os.path.isdir(path) for a in ("--tmpfs", path)]


def _parents(path: str) -> list[str]:
    parent = os.path.dirname(path)
    return [] if parent == path else [*_parents(parent), parent]


def _prlimit(limits: Limits) -> list[str]:
    cpu = int(limits.timeout_s) + 1
    memory, output = limits.memory_mb << 20, limits.max_output_bytes + 1
    return [shutil.which("prlimit") or "prlimit", f"--as={memory}:{memory}", f"--cpu={cpu}:{cpu + 1}",
            f"--nproc={limits.max_processes}:{limits.max_processes}", f"--fsize={output}:{output}",
            "--core=0:0", "--nofile=64:64", "--"]


def _drop_to(uid: int) -> list[str]:
    if os.geteuid() != 0:
        return []
    return [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
