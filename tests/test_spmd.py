"""Two ranks under torchrun on CPU: FSDP2 (gloo) train engines inside the whole training loop; `flowrl train
--nproc-per-node 2` (flowrl.runtime.launch) trains alike with none of torchrun's lines. (An uneven batch over two
ranks is named in test_launch's failing-rank launch.)"""

import json
import os
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM

import cli_process

UNSET = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}  # torchrun's banner sets it


def torchrun(*args, cwd):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "flowrl", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=UNSET, timeout=600)


def steps(text: str) -> list[str]:
    """The step lines without their timings."""
    return [line.split(" time=")[0] for line in text.splitlines() if line.startswith("step ")]


def test_two_rank_grpo_trains_checkpoints_and_resumes(tmp_path):
    common = ["train", "grpo", "--set", "train.batch_size=8", "--set", "checkpoint.every=2",
              "--steps", "3"]
    first = torchrun(*common, "--output-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.count("done: 3 steps") == 1  # rank 0 reports
    assert "*****" in first.stderr  # torchrun's banner: what flowrl's launcher leaves out
    shards = tmp_path / "run" / "checkpoints" / "step_000003" / "actor"
    assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # one per rank

    # the same run through flowrl's launcher (test_launch): the same step lines, none of torchrun's
    ours = subprocess.run([sys.executable, "-m", "flowrl", "train", "--nproc-per-node", "2", *common[1:],
                           "--output-dir", str(tmp_path / "ours")],
                          capture_output=True, text=True, env=UNSET, cwd=tmp_path, timeout=600)
    assert ours.returncode == 0, ours.stderr
    assert steps(ours.stdout) == steps(first.stdout), (ours.stdout, first.stdout)
    assert len(steps(ours.stdout)) == 4  # step 0 (the evaluation before training) to step 3
    last = ours.stdout.splitlines()[-1]
    assert last.startswith("done: 3 steps, reward/mean ") and last.endswith(f"output in {tmp_path / 'ours'}"), last
    assert [line for line in ours.stderr.splitlines() if line.strip()] == [], ours.stderr

    again = torchrun(*common[:-1], "4", "--output-dir", str(tmp_path / "run"), cwd=tmp_path)
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
