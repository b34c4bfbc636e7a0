"""Two ranks under torchrun on CPU: FSDP2 (gloo) train engines inside the whole training loop."""

import json
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM

import cli_process


def torchrun(*args, cwd):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "flowrl", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600)


def test_two_rank_grpo_trains_checkpoints_and_resumes(tmp_path):
    common = ["train", "grpo", "--no-progress", "--output-dir", str(tmp_path / "run"), "--set", "train.batch_size=8",
              "--set", "checkpoint.every=2"]
    first = torchrun(*common, "--steps", "3", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.count("done: 3 steps") == 1  # rank 0 reports
    shards = tmp_path / "run" / "checkpoints" / "step_000003" / "actor"
    assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # one per rank

    again = torchrun(*common, "--steps", "4", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "done: 1 steps" in again.stdout  # resumed at step 3
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # step 0: the evaluation before training
    assert 0.0 <= rows[-1]["eval/reward/mean"] <= 1.0
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in rows[1:])
    # the 2 ranks' shards, exported in one process, are the weights the run exported at its end
    exported = cli_process.run("export", str(tmp_path / "run"), "--output", str(tmp_path / "exported"),
                               cwd=tmp_path, timeout=300)
    assert exported.returncode == 0, exported.stderr[-3000:]
    final, mine = (AutoModelForCausalLM.from_pretrained(tmp_path / name).state_dict()
                   for name in ("run/final", "exported"))
    assert final.keys() == mine.keys() and all(torch.equal(final[k], mine[k]) for k in final)


def test_uneven_batch_is_named(tmp_path):
    bad = torchrun("train", "grpo", "--no-progress", "--output-dir", str(tmp_path / "r"), "--set",
                   "train.batch_size=7", cwd=tmp_path)
    assert bad.returncode != 0 and "train.batch_size=7 must be divisible by the world size 2" in bad.stderr
