"""flowrl.engines.service.orphan_guard: a guarded command's process group ends once the process that started it is
gone, kill -9 included (a vLLM server outlived its trainer on the H100 and held 41 GiB); while that process
lives the command runs on, its exit status is the guard's, and a killpg of the group reaches the command."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from flowrl.engines.service.orphan_guard import guarded


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def processes() -> list[tuple[int, str]]:
    """(pid, command line) of every live process, read from /proc (a pgrep through a shell would match the shell)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found.append((int(entry), f.read().replace(b"\0", b" ").decode(errors="replace")))
        except (ValueError, OSError):
            continue
    return found


def wait_gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_the_guarded_command_dies_with_a_parent_killed_by_sigkill(tmp_path):
    pidfile = tmp_path / "child.pid"
    sleeper = [sys.executable, "-c", f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
               "time.sleep(300)"]
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import subprocess, time
        from flowrl.engines.service.orphan_guard import guarded
        subprocess.Popen(guarded({sleeper!r}), start_new_session=True)
        time.sleep(300)""")])
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(pidfile.read_text())
    time.sleep(1.0)
    assert alive(child)  # the parent lives: the command runs on
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    assert wait_gone(child, 15), "the guarded command outlived its parent"


def test_the_guard_passes_the_exit_status_and_a_killpg_reaches_the_command():
    done = subprocess.run(guarded([sys.executable, "-c", "raise SystemExit(7)"]), timeout=60)
    assert done.returncode == 7
    proc = subprocess.Popen(guarded([sys.executable, "-c", "import time; time.sleep(300)"]), start_new_session=True)
    deadline, children = time.monotonic() + 60, []
    while not children and time.monotonic() < deadline:  # the guard imports flowrl.engines first
        children = [pid for pid, args in processes() if "time.sleep(300)" in args and "orphan_guard" not in args
                    and pid != proc.pid]
        time.sleep(0.2)
    assert children
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(10)
    assert all(wait_gone(c, 10) for c in children)


def test_a_vllm_server_whose_trainer_is_killed_while_it_starts_goes_with_it(tmp_path):
    """The engine's own start (VLLMServerEngine, vLLM's CPU server): the trainer process is SIGKILLed while it
    waits for /health; every process of the server's group is gone soon after."""
    pytest.importorskip("vllm")
    from flowrl.engines.models.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "model", chars="0123456789+=", hidden_size=128, num_heads=4,
                             max_position_embeddings=128)
    trainer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from flowrl.engines import ROLLOUT_ENGINES, ModelSource
        from flowrl.engines.models.folders import load_tokenizer
        config = ROLLOUT_ENGINES.get("vllm_server").model_validate({{"engine": "vllm_server", "max_model_len": 128}})
        config.build(ModelSource({str(model)!r}), tokenizer=load_tokenizer({str(model)!r}), device="cpu")""")])
    deadline, group = time.monotonic() + 120, None
    while group is None and time.monotonic() < deadline:  # the guard's command line names the trainer's pid
        found = [pid for pid, args in processes() if f"orphan_guard.py {trainer.pid} --" in args]
        group = found[0] if found else None
        time.sleep(0.2)
    assert group is not None, "the server did not start behind the guard"
    members: list[int] = []
    while len(members) < 2 and time.monotonic() < deadline:  # the guard and the server it runs
        members = []
        for pid, _ in processes():
            try:
                if os.getpgid(pid) == group:
                    members.append(pid)
            except ProcessLookupError:
                continue
        time.sleep(0.2)
    assert len(members) >= 2, members
    trainer.send_signal(signal.SIGKILL)
    trainer.wait(10)
    assert all(wait_gone(pid, 30) for pid in members), os.popen(f"ps -o pid,args -g {group}").read()
