"""kill -9 at random points of a run (checkpoint writes included): the resumed run equals an uninterrupted one."""

import json
import random
import time

import torch
from transformers import AutoModelForCausalLM

import cli_process

ARGS = ["train", "grpo", "--no-progress", "--set", "train.steps=8", "--set", "checkpoint.every=1",
        "--set", "eval.every=0", "--set", "train.batch_size=8"]


def command(folder):
    """`flowrl train` as a process of its own (forked from one that imported flowrl once: tests/cli_process.py)."""
    return [*ARGS, "--output-dir", str(folder)]


def metrics(folder):
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("timing_s/")} for row in rows]


def logged_steps(folder):
    path = folder / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def kill_after_step(folder, step, delay):
    """Start a run, SIGKILL it `delay` seconds after metrics.jsonl shows `step` (the checkpoint of that step is
    being written then); returns whether it was killed (False: it had finished)."""
    proc = cli_process.start(command(folder), cwd=folder.parent)
    deadline = time.monotonic() + 300
    while proc.is_alive() and logged_steps(folder) < step and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(delay)
    killed = proc.is_alive()
    proc.kill()  # SIGKILL: no cleanup of any kind
    proc.join()
    return killed


def test_kill_9_at_random_points_then_resume_equals_an_uninterrupted_run(tmp_path):
    straight = cli_process.run(*command(tmp_path / "straight"), cwd=tmp_path, timeout=600)
    assert straight.returncode == 0, straight.stderr
    rng = random.Random(0)
    kills = sum(kill_after_step(tmp_path / "killed", step, rng.uniform(0.0, 0.3)) for step in (2, 4, 6))
    last = cli_process.run(*command(tmp_path / "killed"), cwd=tmp_path, timeout=600)
    assert last.returncode in (0, 3), last.stderr  # 3: an attempt had finished the run before its kill
    assert kills >= 2
    assert metrics(tmp_path / "killed") == metrics(tmp_path / "straight")
    weights = [AutoModelForCausalLM.from_pretrained(tmp_path / run / "final").state_dict()
               for run in ("straight", "killed")]
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])
