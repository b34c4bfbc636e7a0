"""The sandboxed Python tool: output, each limit cut off with a one-line named error, and the refusal without
bubblewrap (tests/test_sandbox_attacks.py holds the attacks)."""

import os
import time

import pytest

from flowrl.data.isolation import bwrap
from flowrl.data.multiturn.envs import EnvSpec
from flowrl.data.isolation.sandbox import ToolResult, run_python


def test_prints_what_the_code_prints():
    assert run_python("print(7 * 8)") == ToolResult("56\n", "")


def test_a_hang_is_killed_at_the_timeout():
    start = time.perf_counter()
    result = run_python("while True: pass", timeout_s=0.5)
    assert result.error == "timeout after 0.5s" and time.perf_counter() - start < 5


def test_megabytes_of_output_are_cut_off():
    result = run_python("print('x' * 10**7)", max_output_bytes=1024)
    assert result.error == "output over 1024 bytes" and len(result.output) <= 1025


def test_memory_is_limited():
    assert run_python("x = bytearray(2**30)", memory_mb=256).error == "out of memory (limit 256 MB)"


@pytest.mark.parametrize("code, error", [
    ("1 / 0", "ZeroDivisionError: division by zero"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "killed by SIGSEGV"),
    ("raise SystemExit(3)", "exit 3"),
])
def test_a_crash_is_named(code, error):
    assert run_python(code).error == error


def test_no_network_but_its_own_loopback():
    result = run_python("import socket; socket.create_connection(('1.1.1.1', 53), timeout=1)")
    assert result.error == "OSError: [Errno 101] Network is unreachable"
    result = run_python("import socket; socket.create_connection(('127.0.0.1', 9))")
    assert result.error == "ConnectionRefusedError: [Errno 111] Connection refused"


def test_processes_run_as_nobody_and_end_with_the_call():
    """nobody, or a spare uid beside it where a process on the host runs as nobody (flowrl.data.isolation.bwrap.uid_slot)."""
    result = run_python("import subprocess; print(int(subprocess.run(['id', '-u'], capture_output=True).stdout))")
    assert not result.error and int(result.output) in (bwrap.NOBODY, *bwrap._SPARE_UIDS), result


def test_a_fork_bomb_hits_the_process_budget():
    code = "import os, signal\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            signal.pause()\n" \
           "        n += 1\nexcept OSError as e:\n    print(n, e.strerror)"
    count, _, error = run_python(code, max_processes=8).output.partition(" ")
    assert 0 < int(count) < 8 and error.strip() == "Resource temporarily unavailable"


def test_without_bubblewrap_the_tool_refuses_in_one_line_naming_the_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ValueError, match=r"^the python tool needs bubblewrap: apt-get install bubblewrap \(or "
                                         r"roles.rollout.env_options=\{'unsafe_no_sandbox': true\} runs model code "
                                         r"unsandboxed\)$"):
        run_python("print(1)")
    with pytest.raises(ValueError, match="^roles.rollout.env=python needs bubblewrap: apt-get install bubblewrap"):
        EnvSpec("python")
    with pytest.warns(UserWarning, match="roles.rollout.env=calculator: unsafe_no_sandbox: model code runs WITHOUT"):
        EnvSpec("calculator", {"unsafe_no_sandbox": True})


def test_the_unsafe_mode_runs_unsandboxed_with_the_limits_kept(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap: only the unsafe mode runs
    assert run_python("import os; print(os.getuid())", unsafe_no_sandbox=True).output == f"{os.getuid()}\n"
    assert run_python("while True: pass", timeout_s=0.5, unsafe_no_sandbox=True).error == "timeout after 0.5s"
    assert run_python("x = bytearray(2**30)", unsafe_no_sandbox=True).error == "out of memory (limit 256 MB)"


def test_the_tool_runs_isolated_from_the_callers_environment(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "x")
    names = set(eval(run_python("import os; print(sorted(os.environ))").output))
    assert names - {"LC_CTYPE"} == {"PATH", "PWD", "MALLOC_ARENA_MAX"}  # Python sets LC_CTYPE, bwrap PWD


@pytest.mark.parametrize("code, error", [
    ("print(1)\0", "code contains a NUL byte"),
    ("x = 1\n" * 25_000, "code over 131071 bytes"),
    ("print('\ud800')", "code holds a character that is not text (surrogates not allowed at 7)"),
])
def test_code_that_cannot_be_handed_to_exec_is_a_tool_error_not_a_raise(code, error):
    assert run_python(code) == ToolResult("", error)


def test_code_just_under_the_exec_limit_runs():
    assert run_python("#" * (131071 - 9) + "\nprint(5)") == ToolResult("5\n", "")
