"""`flowrl train --nproc-per-node N` (issue 48.4, the torchrun line of the README): the ranks of torchrun's own
launcher, with none of torchrun's lines. The step lines equal torchrun's; a failing rank's line is all a
failure prints, with that rank's exit code; bad input is one line before any rank starts. The launcher's step
lines are compared with torchrun's in test_spmd (beside the torchrun run that test makes anyway)."""

import os
import subprocess
import sys

import cli_process
from flowrl.runtime.launch import without_nproc

FAST = ["eval.every=0", "checkpoint.export=false", "train.batch_size=4", "train.steps=2"]
TESTS = os.path.dirname(__file__)
ENV = {**os.environ, "PYTHONPATH": TESTS}


def test_a_failing_rank_is_its_own_line_and_its_exit_code(tmp_path):
    """A batch of 7 over 2 ranks: an error only the ranks find (the world size is theirs), each its own line
    (test_spmd's uneven batch under torchrun, in this launch: a 2-rank start costs ~20 s of imports on 2 cores)."""
    done = subprocess.run([sys.executable, "-m", "flowrl", "train", "--nproc-per-node", "2", "grpo",
                           f"train.output_dir={tmp_path / 'run'}", *FAST, "train.batch_size=7"],
                          capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=300)
    assert done.returncode == 2, done.stderr
    said = "train.batch_size=7 must be divisible by the world size 2"
    assert sorted(done.stderr.splitlines()) == [f"flowrl: error (rank 1): {said}", f"flowrl: error: {said}"]


def test_bad_input_is_one_line_before_any_rank_starts(tmp_path):
    done = cli_process.run("train", "--nproc-per-node", "2", "train.stepz=2", cwd=tmp_path, env=ENV, timeout=120)
    assert (done.returncode, done.stderr.splitlines()) == (
        2, ["flowrl: error: invalid config: train.stepz: Extra inputs are not permitted"])
    zero = cli_process.run("train", "--nproc-per-node", "0", cwd=tmp_path, env=ENV, timeout=120)
    assert (zero.returncode, zero.stderr.splitlines()) == (
        2, ["flowrl: error: --nproc-per-node: expected 1 or more ranks, got 0"])


def test_each_rank_runs_the_command_line_without_the_count():
    assert without_nproc(["train", "--nproc-per-node", "4", "grpo", "--nproc-per-node=2", "x=1"]) == \
        ["train", "grpo", "x=1"]


def test_a_rank_stopping_on_bad_input_waits_for_its_peers_to_say_theirs(monkeypatch):
    """wait_for_peers_to_say: the first rank returns only once the second has said its line too (the launcher
    ended a rank a few seconds behind before it printed); alone, it goes at its deadline; outside a launch at once."""
    import threading
    import time

    from torch.distributed import TCPStore

    from flowrl.runtime.launch import wait_for_peers_to_say

    assert wait_for_peers_to_say(5.0) == 1  # no launch here
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(master.port))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "t")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    first = {}
    thread = threading.Thread(target=lambda: first.update(said=wait_for_peers_to_say(30.0), at=time.monotonic()))
    thread.start()
    time.sleep(1.0)
    assert thread.is_alive()  # still waiting for the second rank
    second_at = time.monotonic()
    assert wait_for_peers_to_say(30.0) == 2
    thread.join(timeout=10)
    assert first["said"] == 2 and first["at"] >= second_at
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a restart counts afresh: alone, it waits out its deadline
    start = time.monotonic()
    assert wait_for_peers_to_say(1.0) == 1
    assert 1.0 <= time.monotonic() - start < 5.0


def test_a_ranks_error_line_is_one_write(tmp_path, monkeypatch):
    """The ranks of a launch share the launcher's stderr: `print`'s two writes (the text, then its newline) let rank
    1's line land inside rank 0's in CI ("...size 2flowrl: error (rank 1): ..."). Each rank's line is one write."""
    import io

    from flowrl import cli

    writes = []

    class Recorder(io.StringIO):
        def write(self, text):
            writes.append(text)
            return len(text)

    monkeypatch.setattr(sys, "stderr", Recorder())
    monkeypatch.setenv("RANK", "1")
    assert cli.main(["plot", str(tmp_path / "nowhere")]) == cli.EXIT_USER_ERROR
    assert [w for w in writes if w] == [f"flowrl: error (rank 1): {tmp_path / 'nowhere'}: no metrics.jsonl "
                                           "(give a run's train.output_dir or its metrics.jsonl)\n"]
