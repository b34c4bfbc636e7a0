"""The measured staleness of a streamed grpo_async run on CPU: how many versions each trained row lags.

Trains the tiny model (the tests' ParityTask) with `fl.buffer(k, stream=True)`, partial rollouts, and rollout
dumps every step; each dumped row holds `policy_version` (the weights that sampled its oldest token) and
`trained_version` (the weights it trained). Prints one JSON line: the rows at each staleness, the samples dropped
(more than k behind) and the per-step maximum.

Usage: OMP_NUM_THREADS=1 python benchmarks/staleness_cpu.py [--k 2] [--steps 8] [--max-new-tokens 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

from flowrl.config import load_run_config
from flowrl.runtime.trainer import train

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # fakes:ParityTask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--partial", default="true", choices=["true", "false"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out:
        history = train(load_run_config(None, [
            "algorithm=grpo_async", "task.name=fakes:ParityTask", "train.batch_size=4", "algo.group_size=4",
            f"train.steps={args.steps}", f"algo.max_staleness={args.k}", "algo.stream=true",
            f"roles.rollout.partial={args.partial}", f"roles.rollout.max_new_tokens={args.max_new_tokens}",
            "eval.every=0", "checkpoint.every=0", "checkpoint.export=false", "debug.dump_rollouts_every=1",
            f"train.output_dir={out}"]), progress=False)
        rows = Counter()
        for path in sorted(Path(out, "rollouts").glob("step_*.jsonl")):
            for line in path.open():
                row = json.loads(line)
                rows[row["trained_version"] - row["policy_version"]] += 1
    print(json.dumps({"k": args.k, "steps": args.steps, "rows_at_staleness": dict(sorted(rows.items())),
                      "dropped": sum(r["buffer/dropped"] for r in history),
                      "max_per_step": [r["buffer/staleness/max"] for r in history],
                      "mixed_versions": sum(r["stream/mixed_versions"] for r in history)}))


if __name__ == "__main__":
    main()
