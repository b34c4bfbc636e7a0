"""kill -9 at random points of a run (checkpoint writes included): the resumed run equals an uninterrupted one."""

import json
import random
import subprocess
import sys
import time

import torch
from transformers import AutoModelForCausalLM

KILLS = 3
ARGS = ["train", "grpo", "--no-progress", "--set", "train.steps=8", "--set", "train.save_every=1",
        "--set", "train.eval_every=0", "--set", "train.batch_size=8"]


def command(folder):
    return [sys.executable, "-m", "flowrl", *ARGS, "--output-dir", str(folder)]


def metrics(folder):
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("timing_s/")} for row in rows]


def test_kill_9_at_random_points_then_resume_equals_an_uninterrupted_run(tmp_path):
    start = time.perf_counter()
    straight = subprocess.run(command(tmp_path / "straight"), capture_output=True, text=True, timeout=600)
    duration = time.perf_counter() - start
    assert straight.returncode == 0, straight.stderr
    rng, kills = random.Random(0), 0
    for attempt in range(KILLS + 1):  # KILLS attempts killed at random points of the run, then one to the end
        proc = subprocess.Popen(command(tmp_path / "killed"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        try:
            _, err = proc.communicate(timeout=rng.uniform(0.4, 1.0) * duration if attempt < KILLS else 600)
        except subprocess.TimeoutExpired:
            proc.kill()  # SIGKILL: no cleanup of any kind
            proc.communicate()
            kills += 1
            continue
        assert proc.returncode in (0, 3), err  # 3: an earlier attempt had already finished the run
        if proc.returncode == 3:
            break
    assert kills >= 2 and proc.returncode in (0, 3)
    assert metrics(tmp_path / "killed") == metrics(tmp_path / "straight")
    weights = [AutoModelForCausalLM.from_pretrained(tmp_path / run / "final").state_dict()
               for run in ("straight", "killed")]
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])
