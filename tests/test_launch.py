"""`flowrl train --nproc-per-node N` (issue 48.4, the torchrun line of the README): the ranks of torchrun's own
launcher, with none of torchrun's lines. The step lines equal torchrun's; a failing rank's line is all a
failure prints, with that rank's exit code; bad input is one line before any rank starts."""

import os
import subprocess
import sys

import cli_process
from flowrl.runtime.launch import without_nproc

FAST = ["eval.every=0", "checkpoint.export=false", "train.batch_size=4", "train.steps=2"]
TESTS = os.path.dirname(__file__)
ENV = {**os.environ, "PYTHONPATH": TESTS}
UNSET = {key: value for key, value in ENV.items() if key != "OMP_NUM_THREADS"}  # torchrun's banner says it sets it


def steps(text: str) -> list[str]:
    """The step lines without their timings."""
    return [line.split(" time=")[0] for line in text.splitlines() if line.startswith("step ")]


def test_two_ranks_train_as_under_torchrun_with_none_of_its_lines(tmp_path):
    torchrun = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
                               "flowrl", "train", "grpo", f"train.output_dir={tmp_path / 'torchrun'}", *FAST],
                              capture_output=True, text=True, env=UNSET, cwd=tmp_path, timeout=300)
    assert torchrun.returncode == 0, torchrun.stderr
    assert "*****" in torchrun.stderr  # its banner: what the launcher leaves out
    ours = subprocess.run([sys.executable, "-m", "flowrl", "train", "--nproc-per-node", "2", "grpo",
                           f"train.output_dir={tmp_path / 'ours'}", *FAST],
                          capture_output=True, text=True, env=UNSET, cwd=tmp_path, timeout=300)
    assert ours.returncode == 0, ours.stderr
    assert steps(ours.stdout) == steps(torchrun.stdout) and len(steps(ours.stdout)) == 2, (ours.stdout,
                                                                                           torchrun.stdout)
    last = ours.stdout.splitlines()[-1]
    assert last.startswith("done: 2 steps, reward/mean ") and last.endswith(f"output in {tmp_path / 'ours'}"), last
    assert [line for line in ours.stderr.splitlines() if line.strip()] == [], ours.stderr


def test_a_failing_rank_is_its_own_line_and_its_exit_code(tmp_path):
    done = subprocess.run([sys.executable, "-m", "flowrl", "train", "--nproc-per-node", "2", "grpo",
                           f"train.output_dir={tmp_path / 'run'}", "task.name=no_such_module:Task", *FAST],
                          capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=300)
    assert done.returncode == 2, done.stderr
    said = "task.name: cannot load 'no_such_module:Task': ModuleNotFoundError: No module named 'no_such_module'"
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
