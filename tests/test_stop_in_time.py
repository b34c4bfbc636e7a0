"""SIGTERM of an sft, an rm and a streamed run ends it within checkpoint.shutdown_timeout_s (25 s by default,
below the usual 30 s grace) with a checkpoint of the step it was in (issue 40.8). They took 33-61 s under load.
Real processes (tests/cli_process.py) and real folders."""

import json
import random
import signal
import subprocess
import sys
import time

import pytest

from flowrl.runtime.store import checkpoint

BUDGET_S = 25  # checkpoint.shutdown_timeout_s's default: the documented budget from SIGTERM to exit


def sft_data(folder):
    rng = random.Random(0)
    rows = [{"prompt": f"{a}+{b}=", "response": str(a + b)} for a, b in
            ((rng.randint(0, 9), rng.randint(0, 9)) for _ in range(32))]
    (folder / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [f"data.train_files={folder / 'sft.jsonl'}", "roles.actor.mini_batch_size=8", "roles.actor.micro_batch_size=4"]


def rm_data(folder):
    rows = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": "=" * len(str(a + b))}
            for a in range(6) for b in range(6)]
    (folder / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [f"data.train_files={folder / 'pairs.jsonl'}", "roles.learned_reward.mini_batch_size=8",
            "roles.learned_reward.micro_batch_size=8"]


RUNS = {
    "sft": lambda folder: ["sft", *sft_data(folder)],
    "rm": lambda folder: ["rm", *rm_data(folder)],
    "streamed": lambda folder: ["grpo_async", "algo.stream=true", "algo.max_staleness=1", "roles.rollout.partial=true",
                                "roles.rollout.max_in_flight=8", "algo.group_size=2"],
}


def rows(folder):
    path = folder / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize("kind", list(RUNS))
def test_sigterm_ends_the_run_within_the_budget_with_a_checkpoint(tmp_path, kind):
    algorithm, *sets = RUNS[kind](tmp_path)
    sets += ["train.steps=100000", "checkpoint.every=0", "eval.every=0", "checkpoint.export=false",
             "train.batch_size=8"]
    err = tmp_path / "stderr"
    args = [sys.executable, "-m", "flowrl", "train", algorithm, "--no-progress", "--output-dir", str(tmp_path / "run"),
            *sum((["--set", s] for s in sets), [])]
    with open(err, "w") as stderr:  # the real CLI: its interpreter's exit (threads, atexit) is part of the time
        run = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 300
    while run.poll() is None and rows(tmp_path / "run") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.poll() is None, err.read_text()
    sent = time.monotonic()
    run.send_signal(signal.SIGTERM)
    try:
        run.wait(120)
    except subprocess.TimeoutExpired:
        run.kill()
        run.wait()
    took = time.monotonic() - sent
    said = err.read_text()
    print(f"{kind}: {took:.1f} s from SIGTERM to exit")
    assert run.returncode == 128 + signal.SIGTERM, said
    assert took < BUDGET_S, f"{kind}: {took:.1f} s from SIGTERM to exit\n{said}"
    step = checkpoint.read_state(checkpoint.latest(tmp_path / "run" / "checkpoints"))["step"]
    assert said.strip().splitlines()[-1] == (
        f"flowrl: stopped by SIGTERM after step {step}; checkpoint {tmp_path}/run/checkpoints/step_{step:06d}; "
        f"resume with train.output_dir={tmp_path}/run"), said
    assert rows(tmp_path / "run") == step  # every logged step is in the checkpoint
