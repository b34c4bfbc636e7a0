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
