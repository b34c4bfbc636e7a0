"""Faults keep data whole (issue 29.4): one run per output folder, failures inside torch's checkpoint code as
one line with no temporary folder left, a full disk, SIGTERM and SIGINT saving a checkpoint at a safe point."""

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from fakes import FakeTrainEngine
from flowrl.config import load_run_config
from flowrl.runtime.store import checkpoint
from flowrl.runtime.shutdown import Stopped
from flowrl.runtime.trainer import train

FAST = ["--no-progress", "--set", "eval.every=0", "--set", "checkpoint.export=false", "--set", "train.batch_size=8"]
TESTS = str(Path(__file__).parent)


def config(path, *overrides):
    return load_run_config(None, [f"train.output_dir={path}", "eval.every=0", "checkpoint.export=false",
                                  "train.batch_size=8", *overrides])


def start(folder, *overrides, reward_s="0.5"):
    """`flowrl train` on the slow-reward task (each step scores for `reward_s` seconds), in the background."""
    env = {**os.environ, "PYTHONPATH": TESTS, "FLOWRL_TEST_REWARD_S": reward_s, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "flowrl", "train", "grpo", *FAST, "--output-dir", str(folder),
            "--set", "task.name=broken_tasks:SlowReward", *sum((["--set", o] for o in overrides), [])]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for(path, timeout=300):
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path.exists(), f"{path} never appeared"


class FailingEngine(FakeTrainEngine):
    """Its save fails inside DCP as DCP reports it: a CheckpointException (a BaseException) wrapping `error`."""

    def __init__(self, error):
        super().__init__()
        self.error = error

    def save(self, path):
        super().save(path)
        (Path(path) / "__0_0.distcp").write_bytes(b"half")
        raise CheckpointException("save failed", {0: (self.error, traceback.StackSummary())})


def test_failures_inside_torch_checkpoint_are_one_line_and_leave_no_temporary_folder(tmp_path):
    checkpoint.save(tmp_path, 1, {"actor": FakeTrainEngine()}, {"x": 1})
    cases = [(OSError(errno.ENOSPC, "No space left on device"), checkpoint.CheckpointError,
              r"step_000002: could not be written \(the disk is full\); the previous checkpoint is intact$"),
             (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598\nmore"),
              checkpoint.CheckpointError, r"\(RuntimeError: \[enforce fail .* vs 598\); the previous"),
             (KeyboardInterrupt(), KeyboardInterrupt, r"interrupted while writing checkpoint .*step_000002")]
    for error, raised, message in cases:
        with pytest.raises(raised, match=message) as caught:
            checkpoint.save(tmp_path, 2, {"actor": FailingEngine(error)}, {"x": 2})
        assert "\n" not in str(caught.value)
        assert checkpoint.latest(tmp_path).name == "step_000001" and not list(tmp_path.glob(".tmp_*"))


def test_resuming_after_turning_lora_on_is_one_line_naming_the_checkpoint(tmp_path):
    train(config(tmp_path, "train.steps=1"), progress=False)
    with pytest.raises(checkpoint.CheckpointError, match=r"step_000001: role 'actor' does not load into this "
                                                         r"run's engine \(ModelMismatch: parameter '\S+lora_A\S+' "
                                                         r"is not in \S+step_000001/actor\); it was saved under other "
                                                         r"model or engine settings \(LoRA"):
        train(config(tmp_path, "train.steps=2", "roles.actor.lora_rank=4"), progress=False)
    assert checkpoint.latest(tmp_path / "checkpoints").name == "step_000001"


def test_a_second_run_on_a_folder_in_use_is_refused_and_sigterm_saves_a_checkpoint_at_the_next_step(tmp_path):
    run = start(tmp_path, "train.steps=500", "checkpoint.every=0")
    wait_for(tmp_path / "metrics.jsonl")  # step 1 is done
    with pytest.raises(ValueError, match=rf"train.output_dir '{tmp_path}' is in use by another run \(pid "
                                         rf"{run.pid} on host .*\); wait for it to end or use another output_dir"):
        train(config(tmp_path, "train.steps=500"), progress=False)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGTERM, err
    last = err.strip().splitlines()[-1]
    step = checkpoint.read_state(checkpoint.latest(tmp_path / "checkpoints"))["step"]
    assert last == (f"flowrl: stopped by SIGTERM after step {step}; checkpoint {tmp_path}/checkpoints/"
                    f"step_{step:06d}; resume with train.output_dir={tmp_path}")
    assert err.count("stopping after this step") == 1, err  # the trainer's line once
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == step  # every logged step was saved
    rows = train(config(tmp_path, f"train.steps={step + 1}", "task.name=broken_tasks:SlowReward"),
                 progress=False)  # the lock went with the run
    assert [row["step"] for row in rows] == [step + 1]


def test_sigint_stops_at_the_end_of_the_step_with_a_checkpoint(tmp_path):
    def interrupt(step, logged):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)  # Python's default_int_handler, or SIG_IGN under `cmd &` in a script
    with pytest.raises(Stopped, match=r"stopped by SIGINT after step 2; checkpoint .*step_000002") as stopped:
        train(config(tmp_path, "train.steps=6", "checkpoint.every=0"), progress=False, on_step=interrupt)
    assert stopped.value.exit_code == 130
    assert checkpoint.latest(tmp_path / "checkpoints").name == "step_000002"
    assert signal.getsignal(signal.SIGINT) is before  # the handlers are given back


def test_no_safe_point_within_the_shutdown_timeout_exits_with_a_line_and_the_last_checkpoint_intact(tmp_path):
    train(config(tmp_path, "train.steps=1", "task.name=broken_tasks:SlowReward"), progress=False)
    run = start(tmp_path, "train.steps=3", "checkpoint.shutdown_timeout_s=1", reward_s="60")
    said = []
    for line in run.stderr:  # the run is in step 2 once it says it resumed; its scoring takes a minute
        said.append(line)
        if "resumed from step 1" in line:
            break
    time.sleep(1)
    run.send_signal(signal.SIGTERM)
    began = time.monotonic()
    _, err = run.communicate(timeout=60)
    assert time.monotonic() - began < 20 and run.returncode == 128 + signal.SIGTERM, said + [err]
    assert err.strip().splitlines()[-1] == ("flowrl: SIGTERM: no safe point within checkpoint.shutdown_timeout_s=1; "
                                            "exiting without a new checkpoint (the last one is intact; rerun the "
                                            "same command to resume from it)")
    assert checkpoint.latest(tmp_path / "checkpoints").name == "step_000001"


def _can_mount_tmpfs(folder):
    done = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {folder}"],
                          capture_output=True)
    return shutil.which("unshare") and done.returncode == 0


def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_last_checkpoint_survives(tmp_path):
    """A 3 MB tmpfs (in a mount namespace of its own): the tiny model and one checkpoint fit, the second
    checkpoint does not."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _can_mount_tmpfs(disk):
        pytest.skip("no unprivileged mount namespace here (unshare -rm)")
    train_args = " ".join([sys.executable, "-m", "flowrl", "train", "grpo", *FAST, "--set", "train.steps=3",
                           "--set", "checkpoint.every=1", "--output-dir", f"{disk}/run"])
    # the checkpoints copied out of the namespace (as they are: cp -a) and checked here, not by a second
    # `python -c` inside it that paid ~6 s of CPU for flowrl's imports
    kept = tmp_path / "kept"
    script = f"mount -t tmpfs -o size=3m tmpfs {disk} && {train_args}; echo rc=$?; ls -a {disk}/run/checkpoints; " \
             f"cp -a {disk}/run/checkpoints {kept}"
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    # the disk is full as an OSError (ENOSPC), or as torch's writer's "unexpected pos" with the free space named
    assert done.stderr.strip().startswith(f"flowrl: error: checkpoint {disk}/run/checkpoints/step_000002: could not "
                                          f"be written (the disk is full"), done.stderr
    assert done.stderr.strip().endswith("the previous checkpoint is intact") and "\n" not in done.stderr.strip()
    assert done.stdout.split() == ["rc=2", ".", "..", "latest", "step_000001"], done.stdout
    with warnings.catch_warnings():  # a damaged checkpoint or pointer warns: an error here
        warnings.simplefilter("error")
        assert checkpoint.latest(kept).name == "step_000001"
