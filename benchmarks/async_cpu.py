"""grpo_async on CPU: steps per second for max_staleness k = 0, 1, 2, batched or streamed, on either executor.

Runs the tiny built-in model and task (`flowrl train` with no model) through the trainer once per setting,
`--steps` steps each, with responses up to `--max-new-tokens` long: the untrained tiny model ends a response at
eos about as often as at any other token, so lengths are long-tailed (most short, some running to the cap). A
batched step waits for its longest response; a streamed one (`algo.stream=true`, flowrl.runtime.offpolicy.streaming)
trains on the first `train.batch_size` groups to finish while the long ones go on (their samples at most k
versions old). In one process nothing overlaps: the local executor pauses generation while it trains. With
`--ray` the run is on the Ray executor with split pools (actor and ref on pool `train`, the rollout on `gen`):
batched, step t+k's generation runs beside step t's training; streamed, the rollout's worker keeps sampling
while the actor trains (flowrl.runtime.ray.streaming), and `done_while_training` counts the groups that finished
meanwhile.

Prints one JSON line per setting: k, stream, steps/s (the first step, which builds and warms up, left out),
mean response length and staleness, dropped rows.

Usage: OMP_NUM_THREADS=1 python benchmarks/async_cpu.py [--steps 4] [--max-new-tokens 48] [--settings 0,1,2,0s,1s,2s]
       [--ray]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from flowrl.config import load_run_config
from flowrl.runtime.trainer import train

RAY = ["executor.name=ray", 'placement={"pools": [{"name": "train", "roles": ["actor", "ref"]}, '
                             '{"name": "gen", "roles": ["rollout"]}]}']


def run(k: int, stream: bool, args: argparse.Namespace, folder: Path) -> dict[str, float]:
    cfg = load_run_config(None, [f"train.output_dir={folder}", "algorithm=grpo_async", f"train.steps={args.steps}",
                                 f"train.batch_size={args.batch_size}", f"algo.group_size={args.group_size}",
                                 f"algo.max_staleness={k}", f"algo.stream={str(stream).lower()}",
                                 f"roles.rollout.max_new_tokens={args.max_new_tokens}",
                                 f"roles.rollout.max_in_flight={args.max_in_flight}",
                                 f"roles.rollout.partial={str(args.partial).lower()}",
                                 "eval.every=0", "checkpoint.export=false", "checkpoint.every=0",
                                 *(RAY if args.ray else [])])
    rows = train(cfg, progress=False)
    timed = rows[1:] or rows

    def mean(key: str) -> float:
        return sum(r.get(key, 0.0) for r in rows) / len(rows)

    return {"k": k, "stream": stream, "steps_per_s": round(len(timed) / sum(r["timing_s/step"] for r in timed), 3),
            "response_length": round(mean("response_length/mean"), 2),
            "staleness": round(mean("buffer/staleness/mean"), 3), "dropped": mean("buffer/dropped"),
            "wait_s": round(mean("stream/wait_s"), 3),
            **({"done_while_training": mean("stream/done_while_training")} if args.ray and stream else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-in-flight", type=int, default=64)
    parser.add_argument("--partial", action="store_true", help="streamed: abort and resume at a weight update")
    parser.add_argument("--settings", default="0,1,2,0s,1s,2s", help="k per run; a trailing s streams")
    parser.add_argument("--ray", action="store_true", help="the Ray executor, the rollout on a pool of its own")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for i, setting in enumerate(args.settings.split(",")):
            k, stream = int(setting.rstrip("s")), setting.endswith("s")
            print(json.dumps(run(k, stream, args, Path(tmp) / str(i))), flush=True)


if __name__ == "__main__":
    main()
