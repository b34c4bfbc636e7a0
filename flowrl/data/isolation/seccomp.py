"""The python tool's seccomp filter, compiled by libseccomp (through ctypes) for bwrap's --seccomp.

Everything is allowed but the kernel interfaces a tool never needs and escapes are made of, which fail with
EPERM: new namespaces (unshare, setns, clone with a CLONE_NEW* flag; clone3, whose flags libseccomp cannot
read, fails with ENOSYS so that libc falls back to clone), mounts and the new mount API, ptrace and
process_vm_*, keyrings, bpf, perf events, userfaultfd, io_uring, kernel modules and kexec, file handles,
reboot, swap, acct, syslog, and TIOCSTI/TIOCLINUX (typing into a terminal). Syscalls of another ABI (i386
through int 0x80, x32) kill the process: libseccomp's filter admits only the native architecture.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os

DENIED = ("unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount",
          "fspick", "move_mount", "open_tree", "mount_setattr", "ptrace", "process_vm_readv", "process_vm_writev",
          "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
          "io_uring_enter", "io_uring_register", "init_module", "finit_module", "delete_module", "kexec_load",
          "kexec_file_load", "open_by_handle_at", "name_to_handle_at", "reboot", "swapon", "swapoff", "acct",
          "syslog", "quotactl", "lookup_dcookie", "vhangup")
NEW_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)  # CLONE_NEW*
TERMINAL_IOCTLS = (0x5412, 0x541C)  # TIOCSTI, TIOCLINUX
_ALLOW, _MASKED_EQ = 0x7FFF0000, 7  # SCMP_ACT_ALLOW, SCMP_CMP_MASKED_EQ


class _ArgCmp(ctypes.Structure):  # struct scmp_arg_cmp
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("seccomp")
    if name is None:
        return None
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def available() -> bool:
    return _library() is not None


def _errno(code: int) -> int:
    return 0x00050000 | code  # SCMP_ACT_ERRNO


def _rule(lib: ctypes.CDLL, ctx: int, action: int, name: str, *cmps: _ArgCmp) -> None:
    number = lib.seccomp_syscall_resolve_name(name.encode())
    if number < 0:
        return  # not a syscall of this architecture
    array = (_ArgCmp * len(cmps))(*cmps) if cmps else None
    code = lib.seccomp_rule_add_array(ctx, action, number, len(cmps), array)
    assert code == 0, f"seccomp_rule_add({name}) failed: {os.strerror(-code)}"


@functools.lru_cache(maxsize=1)
def program() -> bytes:
    """The filter as the BPF bytes bwrap --seccomp reads."""
    lib = _library()
    assert lib is not None, "available() is checked first"
    ctx = lib.seccomp_init(_ALLOW)
    try:
        for name in DENIED:
            _rule(lib, ctx, _errno(errno.EPERM), name)
        for flag in NEW_NAMESPACES:
            _rule(lib, ctx, _errno(errno.EPERM), "clone", _ArgCmp(0, _MASKED_EQ, flag, flag))
        _rule(lib, ctx, _errno(errno.ENOSYS), "clone3")
        for request in TERMINAL_IOCTLS:
            _rule(lib, ctx, _errno(errno.EPERM), "ioctl", _ArgCmp(1, _MASKED_EQ, 0xFFFFFFFF, request))
        read, write = os.pipe()
        try:
            code = lib.seccomp_export_bpf(ctx, write)
            os.close(write)
            write = -1
            assert code == 0, f"seccomp_export_bpf failed: {os.strerror(-code)}"
            return _read_all(read)
        finally:
            os.close(read)
            if write >= 0:
                os.close(write)
    finally:
        lib.seccomp_release(ctx)


def program_fd() -> int:
    """A pipe's read end holding the program, for bwrap --seccomp FD (the caller closes it)."""
    data = program()
    assert len(data) < 65536, "the program fits a pipe's buffer"
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    return read


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)
