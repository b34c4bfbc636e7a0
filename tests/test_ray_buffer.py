"""fl.buffer on the Ray executor: with the rollout on its own pool, step t+1's generation overlaps step t's
training, and a k = 1 run equals the local executor's (which runs the same schedule one node at a time)."""

import dataclasses
from pathlib import Path

import pytest

import flowrl as fl
from flowrl.algorithms import grpo_async
from flowrl.config import ExecutorSection, RunConfig, load_run_config
from flowrl.data import PromptStream
from flowrl.runtime.factory import make_factory
from flowrl.runtime.trainer import train
from fakes import ROLE_CLASSES, FakeTokenizer, ParityTask, fake_specs

ray = pytest.importorskip("ray")
from flowrl.runtime.ray.executor import RayExecutor  # noqa: E402  (needs ray)
from flowrl.runtime.executor_configs import RayExecutorConfig  # noqa: E402

RAY = RayExecutorConfig(device="cpu", options=ExecutorSection(name="ray", ship_files=False, gc_freeze=False))
INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer"}
SPLIT = fl.Placement(pools=[fl.Pool(name="train", roles=["actor"]), fl.Pool(name="gen", roles=["rollout"])])


@pytest.fixture(scope="module", autouse=True)
def cluster(ray_local):
    """The session's local Ray cluster (conftest.ray_local); workers find `fakes` on PYTHONPATH."""


def run_steps(executor, k, first, steps):
    """`steps` steps from step `first`; the rows of step t were sampled k versions before it (0 at the start)."""
    stream = PromptStream(ParityTask(), FakeTokenizer(), batch_size=2, seed=first)
    start = executor.versions["actor"]
    history = [executor.run_step(step, stream) for step in range(first, first + steps)]
    assert [batch["policy_version"].unique().tolist() for batch, _ in history] == [[start + max(0, t - k)]
                                                                                   for t in range(steps)]
    timed = [logged["timing_s/step"] for _, logged in history[k + 1:]]  # the first steps fill the buffer
    return sum(timed) / len(timed), history[-1][1]


def test_generation_of_the_next_step_overlaps_training_on_split_pools():
    cfg = {"group_size": 2, "max_staleness": 1, "kl_coef": 0.0}
    plan = fl.compile_plan(grpo_async, SPLIT, INPUTS, ROLE_CLASSES, cfg)
    factory = make_factory(RunConfig(), plan, ParityTask(), Path("unused"))
    executor = RayExecutor(plan, dataclasses.replace(factory, specs=fake_specs(generate_s=0.4, update_s=0.4)), RAY)
    try:
        overlapped, logged = run_steps(executor, 1, 0, 4)
        synchronous = executor.for_plan(fl.compile_plan(grpo_async, SPLIT, INPUTS, ROLE_CLASSES,
                                                        {**cfg, "max_staleness": 0}))
        sync, _ = run_steps(synchronous, 0, 4, 3)
    finally:
        executor.close()
    assert logged["timing_s/rollout.generate"] >= 0.4 and logged["timing_s/actor.update"] >= 0.4
    assert sync >= 0.8  # generate, then update: 0.4 s each
    assert overlapped < 0.65, (sync, overlapped)  # side by side: about 0.4 s


def test_k1_on_ray_equals_k1_on_the_local_executor(tmp_path):
    common = ["task.name=fakes:ParityTask", "algorithm=grpo_async", "train.steps=3", "train.batch_size=4",
              "algo.group_size=4", "eval.every=3", "eval.prompts=4", "checkpoint.export=false",
              'placement={"pools": [{"name": "train", "roles": ["actor", "ref"]}, '
              '{"name": "gen", "roles": ["rollout"]}]}']
    local = train(load_run_config(None, [f"train.output_dir={tmp_path / 'local'}", *common]), progress=False)
    remote = train(load_run_config(None, [f"train.output_dir={tmp_path / 'ray'}", *common, "executor.name=ray"]),
                   progress=False)
    assert [row["buffer/staleness/max"] for row in remote] == [0, 1, 1]
    for key in ("reward/mean", "actor/pg_loss", "actor/grad_norm", "actor/rollout/is_weight_mean",
                "eval/reward/mean"):
        assert [row.get(key) for row in remote] == pytest.approx([row.get(key) for row in local], abs=1e-6), key
