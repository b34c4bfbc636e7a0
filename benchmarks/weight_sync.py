"""Weight sync between split Ray pools on CPU: the state-dict path it replaced against the collective transport.

One local Ray cluster (127.0.0.1), a train pool of 2 ranks (FSDP2 over gloo) and a rollout pool of 1, the
model in bf16 with random weights. Per system, the sync's wall time and each process's peak resident memory
above what it held before (VmHWM; glibc's mmap threshold fixed so freed tensors leave the resident set):

- state_dict: every train rank gathers the full state dict to the CPU (get_model_state_dict), rank 0's goes
  through Ray's object store, and the rollout loads it (flowrl up to ff2c5ef);
- collective: every train rank gathers one entry at a time and rank 0 broadcasts buckets over a gloo group
  of its own with the rollout rank, which loads each bucket as it lands (flowrl.engines.weights.buckets).

    python benchmarks/weight_sync.py --shape 0.5b --shape 1.5b --json out.json

Prints one JSON line per (shape, system) as it goes, then the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]
from common import QWEN05B, qwen_model  # noqa: E402

QWEN15B = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
               intermediate_size=8960, vocab_size=151936)
SHAPES = {"0.5b": QWEN05B, "1.5b": QWEN15B}


def run(shape: str, bucket_mb: int, repeats: int, systems: list[str]) -> list[dict]:
    import ray

    import host_memory as hm
    from flowrl.config import ExecutorSection, load_run_config
    from flowrl.data.builtin.arithmetic import ArithmeticTask
    from flowrl.graph.algorithm import ALGORITHMS
    from flowrl.runtime.factory import make_factory
    from flowrl.runtime.executor_configs import RayExecutorConfig
    from flowrl.runtime.ray.executor import RayExecutor
    from flowrl.runtime.trainer import make_plan

    folder = tempfile.mkdtemp(prefix=f"flowrl-sync-{shape}-")
    path = qwen_model(folder + "/m", ArithmeticTask.chars, SHAPES[shape], 256, torch.bfloat16)
    placement = ('placement={"pools": [{"name": "train", "roles": ["actor"], "world_size": 2}, '
                 '{"name": "gen", "roles": ["rollout"]}]}')
    cfg = load_run_config(None, [f"train.output_dir={folder}/run", f"model.path={path}", "model.dtype=bfloat16",
                                 f"sync.bucket_mb={bucket_mb}", "executor.name=ray", "algo.kl_coef=0.0",
                                 placement])
    task = ArithmeticTask(4)
    plan = make_plan(cfg, ALGORITHMS.get("grpo"), task)
    executor = RayExecutor(plan, make_factory(cfg, plan, task, Path(path)), RayExecutorConfig(
        device="cpu", options=ExecutorSection(name="ray", ship_files=False, gc_freeze=False), sync=cfg.sync))
    rows = []
    try:
        train_ranks, (gen,) = executor.workers["train"], executor.workers["gen"]
        everyone = [*train_ranks, gen]
        node = next(n for n in executor.nodes if n.name == "rollout.sync_weights")

        def collective():
            executor._versions.updates["actor"] += 1
            executor._get([executor.pool_sync.launch(node, 0.0)])

        def state_dict():
            states = [w.__ray_call__.remote(hm.actor_state) for w in train_ranks]  # every rank gathers
            ray.get(gen.__ray_call__.remote(hm.old_load, states[0]))
            ray.wait(states, num_returns=len(states))

        collective()  # warm-up: the group forms, the rollout's copy is paged in
        for name, fn in (("collective", collective), ("state_dict", state_dict)):
            if name not in systems:
                continue
            for _ in range(repeats):
                starts = ray.get([w.__ray_call__.remote(hm.start_measuring) for w in everyone])
                start = time.perf_counter()
                fn()
                seconds = time.perf_counter() - start
                peaks = ray.get([w.__ray_call__.remote(hm.measured, s) for w, s in zip(everyone, starts)])
                row = dict(shape=shape, system=name, sync_s=round(seconds, 3), bucket_mb=bucket_mb,
                           peak_mb_train0=round(peaks[0]), peak_mb_train1=round(peaks[1]),
                           peak_mb_rollout=round(peaks[2]))
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        executor.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES), help="model shape(s); default 0.5b")
    parser.add_argument("--bucket-mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--systems", default="collective,state_dict", help="comma-separated (the state-dict "
                        "path needs about 3.6 x the model's size per process)")
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args()
    import ray

    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "tests"), str(HERE), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
    systems = args.systems.split(",")
    rows = [row for shape in args.shape or ["0.5b"] for row in run(shape, args.bucket_mb, args.repeats, systems)]
    ray.shutdown()
    for shape in args.shape or ["0.5b"]:
        if len(systems) < 2:
            continue
        best = {s: min((r for r in rows if r["shape"] == shape and r["system"] == s), key=lambda r: r["sync_s"])
                for s in ("collective", "state_dict")}
        new, old = best["collective"], best["state_dict"]
        print(f"{shape}: sync {old['sync_s']:.2f} s -> {new['sync_s']:.2f} s ({old['sync_s'] / new['sync_s']:.2f}x); "
              f"peak host MB per process (train0, train1, rollout) "
              f"{old['peak_mb_train0']}/{old['peak_mb_train1']}/{old['peak_mb_rollout']} -> "
              f"{new['peak_mb_train0']}/{new['peak_mb_train1']}/{new['peak_mb_rollout']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
