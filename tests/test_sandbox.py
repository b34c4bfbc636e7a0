"""The sandboxed Python tool: output, and each limit cut off with a one-line named error."""

import time

import pytest

from flowrl.data.sandbox import ToolResult, run_python


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


@pytest.mark.parametrize("code, error", [
    ("import socket; socket.create_connection(('127.0.0.1', 9))", "network is disabled (socket.getaddrinfo)"),
    ("import socket; socket.socket()", "network is disabled (socket.__new__)"),
    ("import os; os.system('curl example.com')", "blocked: os.system"),
    ("import subprocess; subprocess.run(['true'])", "blocked: subprocess.Popen"),
])
def test_no_network_and_no_processes(code, error):
    assert run_python(code).error == error


def test_the_tool_runs_isolated_from_the_callers_environment(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "x")
    assert run_python("import os; print(sorted(os.environ))").output.strip() in ("['PATH']", "['LC_CTYPE', 'PATH']")
