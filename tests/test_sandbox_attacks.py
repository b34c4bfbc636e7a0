"""Hostile code in the python tool (flowrl.data.isolation.sandbox): each attack runs in the sandbox, then the test checks
on the host that the harm did not happen.

Every attack is followed by the same host-side checks (`Targets.assert_intact`): a run folder's checkpoint is
byte-for-byte unchanged and its final/ is still there; two stand-ins for the trainer (one of this test's uid,
one of nobody's, the sandbox's uid) are alive; a TCP server on 127.0.0.1 and an abstract unix socket got no
connection; no file named by the attack's marker appeared in /tmp, /dev/shm, /, /root or the run folder; no
process carrying the marker outlives the call; the secrets (an environment variable, the checkpoint's
content, /etc/shadow's first line, a /dev/shm file) are in neither output nor error. Each attack adds its own
check of what it tried.
"""

import hashlib
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from flowrl.data.isolation import bwrap
from flowrl.data.isolation.sandbox import ToolResult, run_python

SECRET = f"flowrl-secret-{uuid.uuid4().hex}"


@dataclass
class Targets:
    run: Path  # a run folder: checkpoints/step_000001/model.pt and final/config.json
    canaries: list[subprocess.Popen]
    tcp: socket.socket
    unix: socket.socket
    shm: Path
    sysv_shm_id: str
    shadow: str  # /etc/shadow's first line, "" where this test cannot read it
    digest: str = ""
    fields: dict = field(default_factory=dict)

    @property
    def checkpoint(self) -> Path:
        return self.run / "checkpoints" / "step_000001" / "model.pt"

    def assert_intact(self, result: ToolResult, marker: str) -> None:
        assert hashlib.sha256(self.checkpoint.read_bytes()).hexdigest() == self.digest
        assert (self.run / "final" / "config.json").read_text() == SECRET
        assert [c.poll() for c in self.canaries] == [None] * len(self.canaries), "a canary process was killed"
        for listener in (self.tcp, self.unix):
            with pytest.raises(BlockingIOError):
                listener.accept()  # nobody connected
        for folder in ("/tmp", "/dev/shm", "/", "/root", "/usr", "/etc", "/var/tmp", str(self.run), sys.base_prefix):
            assert not os.path.lexists(os.path.join(folder, marker)), f"the sandbox wrote {folder}/{marker}"
        for secret in (SECRET, self.shadow or SECRET):
            assert secret not in result.output + result.error
        assert _processes_with(marker) == [], "a process the sandbox started outlived it"


def _processes_with(marker: str, wait_s: float = 2.0) -> list[str]:
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline and int(pid) != os.getpid():
                found.append(pid)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "checkpoints" / "step_000001" / "model.pt").write_text(SECRET * 4)
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text(SECRET)
    os.environ["FLOWRL_TEST_SECRET"] = SECRET  # the trainer's environment; the sandbox must not see it
    sleeper = [sys.executable, "-c", f"import time; time.sleep(600)  # canary-{SECRET[-8:]}"]
    canaries = [subprocess.Popen(sleeper)]
    if os.geteuid() == 0:  # one of the sandbox's own uid: only the pid namespace keeps it from signalling this one
        canaries.append(subprocess.Popen(["sleep", "600"], user=bwrap.NOBODY, group=bwrap.NOBODY, extra_groups=[]))
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(f"\0flowrl-canary-{SECRET[-8:]}")
    unix.listen()
    for listener in (tcp, unix):
        listener.setblocking(False)
    shm = Path(f"/dev/shm/flowrl-canary-{SECRET[-8:]}")
    shm.write_text(SECRET)
    sysv = subprocess.run(["ipcmk", "-M", "4096"], capture_output=True, text=True).stdout.split()[-1]
    shadow = Path("/etc/shadow").read_text().splitlines()[0] if os.access("/etc/shadow", os.R_OK) else ""
    found = Targets(run, canaries, tcp, unix, shm, sysv, shadow)
    found.digest = hashlib.sha256(found.checkpoint.read_bytes()).hexdigest()
    found.fields = dict(checkpoint=str(found.checkpoint), final=str(run / "final"), run=str(run),
                        pids=[c.pid for c in canaries], port=tcp.getsockname()[1], unix=unix.getsockname(),
                        shm=str(shm), sysv=sysv, me=os.getpid(), prefix=sys.base_prefix)
    yield found
    for c in canaries:
        c.kill()
        c.wait()
    tcp.close()
    unix.close()
    shm.unlink()
    subprocess.run(["ipcrm", "-m", sysv], check=False)
    del os.environ["FLOWRL_TEST_SECRET"]


@dataclass(frozen=True)
class Attack:
    name: str
    code: str  # formatted with Targets.fields and `marker`
    check: Callable[[ToolResult], bool] = lambda result: True  # what this attack tried did not happen
    limits: dict = field(default_factory=dict)


def _as_a_sandbox_uid(output: str, pattern: str) -> bool:
    """The ids `pattern` finds in `output` are one uid the sandbox hands out (nobody, or a spare beside it)."""
    found = re.search(pattern, output)
    return found is not None and len(set(found.groups())) == 1 and \
        int(found.group(1)) in (bwrap.NOBODY, *bwrap._SPARE_UIDS)


def _said(*words: str) -> Callable[[ToolResult], bool]:
    return lambda result: all(word in result.output + result.error for word in words)


TRY = "def attempt(name, f):\n    try:\n        print(name, 'DONE', f())\n    except BaseException as e:\n" \
      "        print(name, 'REFUSED', type(e).__name__)\n"


def _refused(*names: str) -> Callable[[ToolResult], bool]:
    """Each named attempt printed REFUSED (not DONE)."""
    return lambda result: all(f"{n} REFUSED" in result.output and f"{n} DONE" not in result.output for n in names)


ATTACKS = [
    # the attacks
    Attack("read_etc_shadow", TRY + "attempt('shadow', lambda: open('/etc/shadow').read())", _refused("shadow")),
    Attack("read_checkpoint", TRY + "attempt('ckpt', lambda: open({checkpoint!r}, 'rb').read())", _refused("ckpt")),
    Attack("truncate_checkpoint", TRY + "attempt('trunc', lambda: open({checkpoint!r}, 'r+b').truncate(0))",
           _refused("trunc")),
    Attack("delete_final", TRY + "import shutil\nattempt('rm', lambda: shutil.rmtree({final!r}))", _refused("rm")),
    Attack("write_outside_its_folder", TRY + "for d in ['/', '/usr', '/usr/lib', '/etc', '/root', {prefix!r}, "
           "{run!r}, '/var/tmp']:\n    attempt(d, lambda: open(d + '/{marker}', 'w').write('x'))",
           _refused("/usr", "/etc", "/root", "/var/tmp")),
    Attack("run_id_through_posixsubprocess", "import subprocess\n"  # the issue reached it through gc; it is allowed
           "print(subprocess.run(['id'], capture_output=True, text=True).stdout)",
           lambda r: _as_a_sandbox_uid(r.output, r"uid=(\d+) gid=(\d+)") and "uid=0" not in r.output),
    Attack("sigterm_the_trainer", "import os, signal\nfor p in {pids} + [{me}, os.getppid()]:\n    try:\n"
           "        os.kill(p, signal.SIGTERM); print('sent', p)\n    except OSError as e:\n        print(p, e)"),
    Attack("sigkill_the_trainer", "import os, signal\nfor p in {pids} + [{me}]:\n    try:\n"
           "        os.kill(p, signal.SIGKILL)\n    except OSError as e:\n        print(p, e)"),
    Attack("signal_every_visible_process", "import os\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n"
           "        try:\n            os.kill(int(p), 9)\n        except OSError:\n            pass\n"),
    Attack("twenty_detached_processes", "import os\nfor i in range(20):\n    if os.fork() == 0:\n        os.setsid()\n"
           "        if os.fork() == 0:\n            os.execv('/usr/bin/sleep', ['sleep-{marker}', '600'])\n"
           "        os._exit(0)\nprint('parent exits')", _said("parent exits"), {"max_processes": 64}),
    # 64: the attack itself starts 40 processes; a budget of exactly 40 left no headroom when a previous
    # attack's processes still counted against the uid on a busy machine (EAGAIN in one CI run)
    Attack("list_root", "import os\nprint(sorted(os.listdir('/')))",
           lambda r: "'usr'" in r.output and not any(f"'{d}'" in r.output for d in ("work", "home", "var", "opt"))),
    # processes and signals
    Attack("kill_minus_one", "import os\nos.kill(-1, 9)"),
    Attack("ptrace_attach", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
           "print([libc.ptrace(16, p, 0, 0) for p in {pids} + [1, {me}]])", _said("[-1, -1")),
    Attack("see_other_processes", "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
           lambda r: max(eval(r.output)) < 10),  # only the namespace's bwrap reaper, this one and its listing
    Attack("read_parents_files", TRY + "import os\nfor f in ['environ', 'cmdline', 'cwd', 'root', 'fd', 'maps']:\n"
           "    attempt(f, lambda: os.listdir('/proc/1/' + f) if f in ('cwd', 'root', 'fd') else "
           "open('/proc/1/' + f, 'rb').read())",  # pid 1 is bwrap's reaper: root's as root, else the sandbox's uid
           lambda r: os.geteuid() != 0 or _refused("environ", "cwd", "root", "fd", "maps")(r)),
    Attack("read_environ_everywhere", "import os\nfor p in ['self', '1', 'thread-self']:\n    try:\n"
           "        print(open('/proc/%s/environ' % p, 'rb').read())\n    except OSError:\n        pass\n"
           "print(dict(os.environ))"),
    Attack("inherited_file_descriptors", "import os\nfor fd in range(3, 1024):\n    try:\n"
           "        print(fd, os.readlink('/proc/self/fd/%d' % fd), os.read(fd, 100))\n    except OSError:\n"
           "        pass\nprint('done')", lambda r: r.output.strip() == "done"),
    Attack("fork_bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
           _said("timeout")),
    Attack("thread_bomb", "import threading, time\nn = 0\ntry:\n    while True:\n"
           "        threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); n += 1\n"
           "except RuntimeError:\n    print('threads', n)", lambda r: 0 < int(r.output.split()[-1]) < 16),
    Attack("setsid_and_ignore_signals", "import os, signal\nif os.fork() == 0:\n    os.setsid()\n"
           "    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n        signal.signal(s, signal.SIG_IGN)\n"
           "    os.execv('/usr/bin/sleep', ['sleep-{marker}', '600'])\nprint('left it')", _said("left it")),
    # privileges
    Attack("setuid_root", TRY + "import os\nattempt('setuid', lambda: os.setuid(0))\n"
           "attempt('setresuid', lambda: os.setresuid(0, 0, 0))\nprint(os.getresuid())",
           lambda r: _refused("setuid", "setresuid")(r) and _as_a_sandbox_uid(r.output, r"\((\d+), (\d+), (\d+)\)")),
    Attack("ctypes_setuid_and_caps", "import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.setuid(0), libc.setgid(0))\n"
           "print([l for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm', 'CapBnd', "
           "'NoNewPrivs'))])",
           lambda r: r.output.startswith("-1 -1") and r.output.count("0000000000000000") == 3 and "NoNewPrivs:\\t1"
           in r.output),
    Attack("mount_tmpfs_and_proc", "import ctypes\nlibc = ctypes.CDLL(None)\n"
           "print(libc.mount(b'x', b'/tmp', b'tmpfs', 0, None), libc.mount(b'p', b'/proc', b'proc', 0, None))\n"
           "print(libc.mount(None, b'/usr', None, 32 | 4096 | 16384, None))",  # MS_REMOUNT|MS_BIND, rw
           _said("-1 -1\n-1")),
    Attack("chroot_escape", "import ctypes, os\nctypes.CDLL(None).unshare(0x10000000 | 0x20000)\n"
           "os.makedirs('/tmp/j', exist_ok=True)\ntry:\n    os.chroot('/tmp/j')\n"
           "    for _ in range(20):\n        os.chdir('..')\n    os.chroot('.')\nexcept OSError as e:\n"
           "    print('refused', e.errno)\nprint(sorted(os.listdir('/')))", lambda r: "'work'" not in r.output),
    Attack("nested_user_namespace_then_remount", "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
           "print('unshare', libc.unshare(0x10000000 | 0x20000))\n"  # CLONE_NEWUSER | CLONE_NEWNS
           "print('remount', libc.mount(None, b'/usr', None, 32 | 4096 | 16384, None))\n"
           "try:\n    open('/usr/{marker}', 'w')\nexcept OSError as e:\n    print('write', e.errno)\n"
           "print(sorted(os.listdir('/')))",
           lambda r: "unshare -1" in r.output and "remount 0" not in r.output and "'work'" not in r.output),
    Attack("kernel_attack_surface_syscalls", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
           "for name, nr in [('bpf', 321), ('perf_event_open', 298), ('userfaultfd', 323), ('io_uring_setup', 425), "
           "('keyctl', 250), ('add_key', 248), ('init_module', 175), ('kexec_load', 246), ('clone3', 435), "
           "('setns', 308), ('open_by_handle_at', 304)]:\n"
           "    print(name, libc.syscall(nr, 0, 0, 0, 0, 0), ctypes.get_errno())",  # x86_64 numbers
           lambda r: platform.machine() != "x86_64" or r.output.split("\n")[:-1] == [
               f"{name} -1 {38 if name == 'clone3' else 1}" for name in ("bpf", "perf_event_open", "userfaultfd",
               "io_uring_setup", "keyctl", "add_key", "init_module", "kexec_load", "clone3", "setns",
               "open_by_handle_at")]),
    Attack("clone_into_new_namespaces", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
           "print([libc.syscall(56, flag | 17, 0, 0, 0, 0) for flag in "  # clone(CLONE_NEW* | SIGCHLD), x86_64
           "(0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000)])",
           lambda r: platform.machine() != "x86_64" or r.output.strip() == str([-1] * 7)),
    Attack("raise_own_rlimits", TRY + "import resource\nattempt('as', lambda: resource.setrlimit(resource.RLIMIT_AS, "
           "(-1, -1)))\nattempt('nproc', lambda: resource.setrlimit(resource.RLIMIT_NPROC, (-1, -1)))\n"
           "x = bytearray(2**30)", lambda r: _refused("as", "nproc")(r) and r.error.startswith("out of memory")),
    Attack("sethostname", "import ctypes, socket\nprint(ctypes.CDLL(None).sethostname(b'pwned', 5), "
           "socket.gethostname())",
           lambda r: r.output.split() == ["-1", "sandbox"] and socket.gethostname() != "pwned"),
    Attack("kernel_sysctls", TRY + "for f in ['/proc/sys/kernel/core_pattern', '/proc/sys/kernel/modprobe', "
           "'/proc/sysrq-trigger', '/sys/kernel/uevent_helper']:\n    attempt(f, lambda: open(f, 'w'))",
           _refused("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe", "/proc/sysrq-trigger",
                    "/sys/kernel/uevent_helper")),
    Attack("raw_devices", TRY + "for d in ['/dev/mem', '/dev/kmsg', '/dev/vda', '/dev/sda', '/dev/nvidia0', "
           "'/dev/fuse']:\n    attempt(d, lambda: open(d, 'rb').read(1))",
           _refused("/dev/mem", "/dev/kmsg", "/dev/vda", "/dev/sda", "/dev/nvidia0", "/dev/fuse")),
    Attack("cgroup_release_agent", TRY + "import ctypes, os\nos.makedirs('/tmp/cg', exist_ok=True)\n"
           "attempt('mount', lambda: 1 / (ctypes.CDLL(None).mount(b'cgroup', b'/tmp/cg', b'cgroup', 0, b'rdma') + 1) "
           "and 1)\nattempt('sysfs', lambda: os.listdir('/sys/fs/cgroup'))", _refused("mount", "sysfs")),
    Attack("terminal_injection_tiocsti", "import fcntl, os, termios\nfor fd in (0, 1, 2, '/dev/tty'):\n    try:\n"
           "        fd = os.open(fd, os.O_RDWR) if isinstance(fd, str) else fd\n"
           "        fcntl.ioctl(fd, termios.TIOCSTI, b'x'); print('injected')\n    except OSError:\n        pass",
           lambda r: "injected" not in r.output),
    # files
    Attack("symlink_to_secrets", TRY + "import os\nfor i, t in enumerate(['/etc/shadow', {checkpoint!r}, "
           "'/proc/1/root/etc/shadow', '/proc/1/cwd']):\n    os.symlink(t, '/tmp/l%d' % i)\n"
           "    attempt(t, lambda: open('/tmp/l%d' % i, 'rb').read())",
           _refused("/etc/shadow", "/proc/1/root/etc/shadow")),
    Attack("proc_root_of_other_pids", TRY + "for p in ['1', '0', {me!r}]:\n"
           "    attempt(p, lambda: open('/proc/%s/root/etc/shadow' % p).read())", _refused("1", "0")),
    Attack("walk_the_filesystem_for_run_folders", "import os\nhits = []\nfor root, dirs, files in os.walk('/'):\n"
           "    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ('/proc', '/usr', {prefix!r})]\n"
           "    hits += [os.path.join(root, f) for f in dirs + files if 'step_' in f or 'final' in f or 'ckpt' in f]\n"
           "print(hits)", _said("[]")),
    Attack("list_root_home_and_work", TRY + "import os\nfor d in ['/work', '/home', '/root/.ssh', '/var', '/mnt']:\n"
           "    attempt(d, lambda: os.listdir(d))\nprint(sorted(os.listdir('/root')))",
           lambda r: _refused("/work", "/home", "/root/.ssh", "/var", "/mnt")(r)
           and ("['.pyenv']" in r.output or "/root" not in sys.base_prefix)),
    Attack("import_the_trainers_packages", TRY + "for m in ['flowrl', 'torch', 'numpy', 'ray']:\n"
           "    attempt(m, lambda: __import__(m))", _refused("flowrl", "torch", "numpy", "ray")),
    Attack("reopen_own_output_to_overwrite", "import os\nwith open('/proc/self/fd/1', 'w') as f:\n"
           "    f.write('y' * 10**6)", lambda r: len(r.output) <= 4097),
    # budgets
    Attack("memory_bomb", "x = bytearray(8 * 2**30)", _said("out of memory (limit 256 MB)")),
    Attack("memory_bomb_in_many_processes", "import os, time\nfor _ in range(6):\n    if os.fork() == 0:\n"
           "        try:\n            x = bytearray(80 * 2**20)\n        except MemoryError:\n"
           "            print('capped')\n"
           "        time.sleep(5)\ntime.sleep(5)", _said("timeout"), {"memory_mb": 64, "max_processes": 8}),
    Attack("disk_fill", "n = 0\ntry:\n    while True:\n        with open('/tmp/f%d' % n, 'wb') as f:\n"
           "            f.write(b'x' * 4096)\n        n += 1\nexcept OSError as e:\n    print(n * 4096, e.strerror)",
           lambda r: "No space left" in r.output and int(r.output.split()[0]) <= 16 << 20),
    Attack("one_huge_file", "open('/tmp/big', 'wb').write(b'x' * 10**8)", lambda r: r.error != ""),
    Attack("huge_output", "print('x' * 10**7)",
           lambda r: r.error == "output over 4096 bytes" and len(r.output) <= 4097),
    Attack("huge_stderr", "import sys\nsys.stderr.write('x' * 10**8)", lambda r: r.error != "" and len(r.error) <= 200),
    Attack("sleep_forever", "import time\ntime.sleep(10**6)", _said("timeout after 1.0s")),
    Attack("cpu_spin", "while True:\n    pass", _said("timeout")),
    Attack("open_files_bomb", "fs = []\ntry:\n    while True:\n        fs.append(open('/dev/null'))\n"
           "except OSError:\n    print(len(fs))", lambda r: int(r.output) < 64),
    # network and ipc
    Attack("tcp_to_the_trainers_localhost", "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), "
           "timeout=0.5).sendall(b'pwned')\nexcept OSError as e:\n    print('refused', e.errno)", _said("refused")),
    Attack("udp_and_internet", "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ntry:\n"
           "    s.sendto(b'x', ('1.1.1.1', 53)); print('sent')\nexcept OSError as e:\n    print('refused', e.errno)\n"
           "print([line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]])",
           lambda r: "refused" in r.output and "['lo']" in r.output),
    Attack("abstract_unix_socket_to_the_trainer", "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n"
           "    s.connect({unix!r}); s.sendall(b'pwned')\nexcept OSError as e:\n    print('refused', e.errno)",
           _said("refused")),
    Attack("dev_shm_to_talk_to_the_trainer", TRY + "import os\nattempt('read', lambda: open({shm!r}).read())\n"
           "open('/dev/shm/{marker}', 'w').write('x')\nprint(os.listdir('/dev/shm'))", _refused("read")),
    Attack("sysv_shared_memory", "import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.shmat({sysv}, None, 0))\n"
           "print(len(open('/proc/sysvipc/shm').read().splitlines()))", lambda r: r.output.split()[-1] == "1"),
]


def test_there_are_at_least_forty_attacks_with_distinct_names():
    assert len(ATTACKS) >= 40 and len({a.name for a in ATTACKS}) == len(ATTACKS)


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_an_attack_from_inside_the_sandbox_does_no_harm_outside(attack, targets):
    marker = f"flowrl-attack-{uuid.uuid4().hex[:12]}"
    code = attack.code.format(marker=marker, **targets.fields)
    start = time.monotonic()
    result = run_python(code, **{"timeout_s": 1.0, **attack.limits})
    assert time.monotonic() - start < 10, "the call outlived its timeout"
    targets.assert_intact(result, marker)
    assert attack.check(result), result


def test_the_sandbox_dies_with_the_trainer():
    """A trainer killed by SIGKILL mid-call leaves no sandboxed process behind (--die-with-parent)."""
    marker = f"flowrl-attack-{uuid.uuid4().hex[:12]}"
    code = f"import os, time\nif os.fork() == 0:\n    os.setsid()\n" \
           f"    os.execv('/usr/bin/sleep', ['sleep-{marker}', '600'])\ntime.sleep(600)"
    argv = bwrap.command([bwrap.interpreter(), "-I", "-S", "-c", code], bwrap.Limits(timeout_s=600))
    trainer = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\nsubprocess.Popen(sys.argv[1:])\n"
                                "time.sleep(600)", *argv])
    deadline = time.monotonic() + 30
    while not _processes_with(f"sleep-{marker}", wait_s=0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_with(f"sleep-{marker}", wait_s=0), "the sandbox did not start"
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    assert _processes_with(marker, wait_s=5) == []


def test_a_fork_bomb_in_one_call_leaves_a_concurrent_call_its_own_process_budget():
    from concurrent.futures import ThreadPoolExecutor

    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    threads = "import threading, time\nts = [threading.Thread(target=time.sleep, args=(0.5,)) for _ in range(8)]\n" \
              "time.sleep(0.3)\n[t.start() for t in ts]\n[t.join() for t in ts]\nprint('ran', len(ts))"
    # the bomb burns its 2 s; the other call gets 30 s, so a busy 2-core machine (the bomb's forking on one
    # core) cannot time it out (CI, 2026-12-04: at 2 s it did), while a shared process budget still fails it
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda code, limit: run_python(code, timeout_s=limit), [bomb, threads], [2.0, 30.0]))
    assert results[0].error == "timeout after 2.0s" and results[1] == ToolResult("ran 8\n", "")


@pytest.mark.skipif(os.geteuid() != 0, reason="as another user the sandbox's uid lives in its own user namespace")
def test_host_processes_running_as_nobody_leave_a_call_its_whole_process_budget():
    """RLIMIT_NPROC counts every process of a uid on the host: a daemon running as nobody (or an earlier call's
    processes still exiting) would take from a call run as nobody. Four host processes as nobody, a budget of
    four: the call runs as another uid and starts its three threads."""
    sleepers = [subprocess.Popen(["setpriv", f"--reuid={bwrap.NOBODY}", f"--regid={bwrap.NOBODY}", "--clear-groups",
                                  "sleep", "60"]) for _ in range(4)]
    try:
        code = "import os, threading, time\n" \
               "ts = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(3)]\n" \
               "[t.start() for t in ts]\n[t.join() for t in ts]\nprint(os.getuid() != 65534, len(ts))"
        assert run_python(code, timeout_s=30.0, max_processes=4) == ToolResult("True 3\n", "")
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
