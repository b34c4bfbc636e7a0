"""Asynchronous GRPO (fl.buffer) on the Ray executor: step time with max_staleness 0 vs 1, split pools.

The actor and the rollout each get a pool of their own. Their engines are the
test fakes with injected sleeps, so generation (the throughput-limited role)
is the bottleneck whatever else runs on the machine: `--generate-s` per
generation, `--update-s` per actor update. With k = 0 a step generates, then
trains (about G + T); with k = 1 step t+1's generation runs beside step t's
training (about max(G, T)). Prints both, their ratio and the ideal ratio
(G + T) / max(G, T).

Usage: python benchmarks/async_overlap.py [--generate-s 1.0] [--update-s 0.5] [--steps 6]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import ray

import flowrl as fl
from flowrl.algorithms import grpo_async
from flowrl.config import ExecutorSection, RunConfig
from flowrl.data import PromptStream
from flowrl.runtime.factory import make_factory
from flowrl.runtime.executor_configs import RayExecutorConfig
from flowrl.runtime.ray.executor import RayExecutor

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))  # the fake engines, tokenizer and task the tests use
from fakes import ROLE_CLASSES, FakeTokenizer, ParityTask, fake_specs  # noqa: E402

INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer"}
SPLIT = fl.Placement(pools=[fl.Pool(name="train", roles=["actor"]), fl.Pool(name="gen", roles=["rollout"])])


def seconds_per_step(executor: RayExecutor, k: int, first: int, steps: int) -> float:
    """Mean step time after the first k + 1 steps (they fill the buffer)."""
    stream = PromptStream(ParityTask(), FakeTokenizer(), batch_size=4, seed=first)
    times = [executor.run_step(step, stream)[1]["timing_s/step"] for step in range(first, first + steps)]
    return sum(times[k + 1:]) / len(times[k + 1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--generate-s", type=float, default=1.0, help="seconds per generation (G)")
    parser.add_argument("--update-s", type=float, default=0.5, help="seconds per actor update (T)")
    parser.add_argument("--steps", type=int, default=6, help="steps per setting")
    args = parser.parse_args()
    ray.init(include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
        p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)}})
    cfg = {"group_size": 4, "max_staleness": 1, "kl_coef": 0.0}
    plan = fl.compile_plan(grpo_async, SPLIT, INPUTS, ROLE_CLASSES, cfg)
    factory = make_factory(RunConfig(), plan, ParityTask(), Path("unused"))
    specs = fake_specs(generate_s=args.generate_s, update_s=args.update_s)
    options = ExecutorSection(name="ray", ship_files=False, gc_freeze=False)
    executor = RayExecutor(plan, dataclasses.replace(factory, specs=specs), RayExecutorConfig(device="cpu", options=options))
    try:  # one set of workers: the k = 0 plan runs as a view on them
        synchronous = executor.for_plan(fl.compile_plan(grpo_async, SPLIT, INPUTS, ROLE_CLASSES,
                                                        {**cfg, "max_staleness": 0}))
        k0 = seconds_per_step(synchronous, 0, 0, args.steps)
        k1 = seconds_per_step(executor, 1, args.steps, args.steps)
    finally:
        executor.close()
    g, t = args.generate_s, args.update_s
    print(f"G={g:g}s T={t:g}s  k=0 {k0:.3f} s/step  k=1 {k1:.3f} s/step  ratio {k0 / k1:.2f}x  "
          f"ideal {(g + t) / max(g, t):.2f}x")


if __name__ == "__main__":
    main()
