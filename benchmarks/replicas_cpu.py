"""Streamed GRPO on the Ray executor over R rollout replicas (flowrl.runtime.offpolicy.spread_runner): steps/s against R.

The actor and the rollout get a pool each; the rollout pool has R ranks, each a replica. The engines are the
test fakes; each sample takes a long-tailed time (log-normal, median `--median-s`, drawn from its request's
seed, capped at 8x the median) on its replica, one sample at a time per replica (a replica that serves one
request at a time is what makes the count matter on a 2-core machine), so a step waits for the
`batch_size` earliest finished groups as on a real engine. Prints one JSON line per R and the speed-up over
R = 1.

Usage: python benchmarks/replicas_cpu.py [--replicas 1 2 4] [--steps 6] [--median-s 0.05]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import random
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
from fake_streamer import FakeStreamer  # noqa: E402
from fakes import ROLE_CLASSES, FakeTokenizer, ParityTask, fake_specs  # noqa: E402

INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer"}


def long_tail(median_s: float):
    """A make_streamer: FakeStreamer whose samples take a log-normal time from their seed, one at a time."""
    def make(engine):
        inner, lock = FakeStreamer(engine), asyncio.Lock()

        async def sample(request):
            draw = random.Random(request.seed).lognormvariate(math.log(median_s), 1.0)
            async with lock:
                await asyncio.sleep(min(draw, 8 * median_s))
            return await FakeStreamer.sample(inner, request)
        inner.sample = sample
        return inner
    return make


def steps_per_second(replicas: int, steps: int, median_s: float) -> float:
    placement = fl.Placement(pools=[fl.Pool(name="train", roles=["actor"]),
                                    fl.Pool(name="gen", roles=["rollout"], world_size=replicas)])
    plan = fl.compile_plan(grpo_async, placement, INPUTS, ROLE_CLASSES,
                           {"group_size": 4, "max_staleness": 1, "kl_coef": 0.0, "stream": True})
    factory = make_factory(RunConfig(), plan, ParityTask(), Path("unused"))
    specs = fake_specs(rollout={"make_streamer": long_tail(median_s)})
    options = ExecutorSection(name="ray", ship_files=False, gc_freeze=False)
    executor = RayExecutor(plan, dataclasses.replace(factory, specs=specs), RayExecutorConfig(device="cpu", options=options))
    stream = PromptStream(ParityTask(), FakeTokenizer(), batch_size=4, seed=0)
    try:
        times = [executor.run_step(step, stream)[1]["timing_s/step"] for step in range(steps)]
    finally:
        executor.close()
    return 1.0 / (sum(times[2:]) / len(times[2:]))  # the first two fill the buffer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--median-s", type=float, default=0.05)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                 p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)}})
    base = None
    for replicas in args.replicas:
        rate = steps_per_second(replicas, args.steps, args.median_s)
        base = base or rate
        print(json.dumps({"replicas": replicas, "steps_per_s": round(rate, 3), "speedup": round(rate / base, 2)}),
              flush=True)


if __name__ == "__main__":
    main()
