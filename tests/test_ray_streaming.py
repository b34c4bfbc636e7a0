"""fl.buffer(stream=True) on the Ray executor (flowrl.runtime.ray.streaming): with the rollout on its own pool the
engine keeps sampling in the rollout worker while the actor trains, the weights of the next version are synced
into the paused engine, and rows carry the versions that sampled them.

Over the fakes: each generate call (a ThreadedStreamer batch of one group, 2 samples) takes 0.05 s, an update
0.5 s; 2 prompts a batch, k = 1, so step 0 draws 4 prompts and trains on the first 2 groups while the other 2
finish during its update, under version 0; step 1 trains them at version 1 and draws 2 more, sampled under
version 1. Each test starts its own executor (~10-18 s on 2 cores, most of the time).
"""

import dataclasses
from pathlib import Path

import pytest

import flowrl as fl
from flowrl.algorithms import grpo_async
from flowrl.config import ExecutorSection, RunConfig
from flowrl.data import PromptStream
from flowrl.engines.streaming.thread_streamer import ThreadedStreamer
from flowrl.runtime.factory import make_factory
from fake_streamer import FakeStreamer
from fakes import ROLE_CLASSES, FakeTokenizer, ParityTask, fake_specs
from test_ray_buffer import INPUTS, SPLIT

ray = pytest.importorskip("ray")
from flowrl.runtime.ray.executor import RayExecutor  # noqa: E402  (needs ray)
from flowrl.runtime.executor_configs import RayExecutorConfig  # noqa: E402

RAY = RayExecutorConfig(device="cpu", options=ExecutorSection(name="ray", ship_files=False, gc_freeze=False))


@pytest.fixture(scope="module", autouse=True)
def cluster(ray_local):
    """The session's local Ray cluster (conftest.ray_local); workers find `fakes` on PYTHONPATH."""


def executor(placement, **specs):
    plan = fl.compile_plan(grpo_async, placement, INPUTS, ROLE_CLASSES,
                           {"group_size": 2, "max_staleness": 1, "kl_coef": 0.0, "stream": True})
    factory = make_factory(RunConfig(), plan, ParityTask(), Path("unused"))
    return RayExecutor(plan, dataclasses.replace(factory, specs=fake_specs(**specs)), RAY)


def run(steps, placement=SPLIT, **specs):
    ex = executor(placement, **specs)
    prompts = PromptStream(ParityTask(), FakeTokenizer(), batch_size=2, seed=1)
    try:
        return [ex.run_step(step, prompts) for step in range(steps)]
    finally:
        ex.close()


def test_streamed_generation_runs_while_the_actor_trains():
    steps = run(3, generate_s=0.05, update_s=0.5,
                rollout={"make_streamer": lambda engine: ThreadedStreamer(engine, max_batch=2)})
    versions = [(b["policy_version_min"].tolist(), b["policy_version_max"].tolist()) for b, _ in steps]
    assert versions == [([0] * 4, [0] * 4), ([0] * 4, [0] * 4), ([1] * 4, [1] * 4)]
    # step 0's last 2 groups (0.05 s each) finished during its 0.5 s update; step 1's draw during its own
    assert [logged["stream/done_while_training"] for _, logged in steps[:2]] == [2, 2]
    assert [logged["buffer/staleness/max"] for _, logged in steps] == [0, 1, 1]
    assert [logged["stream/wait_s"] < 0.25 for _, logged in steps[1:]] == [True, True]  # ready before the take
    for _, logged in steps:
        assert logged["buffer/dropped"] == 0 and logged["stream/aborted"] == 0
        assert {"reward/mean", "response_length/mean", "actor/pg_loss", "stream/in_flight"} <= set(logged)


def test_streaming_beside_the_consumers_is_refused_in_one_line():
    shared = fl.Placement(pools=[fl.Pool(name="all", roles=["actor", "rollout"])])
    with pytest.raises(fl.PlanError, match=r"^grpo_async: fl.buffer\(stream=True\) on the Ray executor needs rollout "
                                           r"on a pool of its own \(split placement; or executor.name=local\): pool "
                                           r"'all' also hosts actor$"):
        executor(shared)


WIDE = fl.Placement(pools=[fl.Pool(name="train", roles=["actor"]), fl.Pool(name="gen", roles=["rollout"],
                                                                           world_size=2)])


def test_two_rollout_replicas_stream_the_rows_one_replica_does():
    """Each rank of the rollout pool is a replica (flowrl.runtime.offpolicy.spread_runner); a group is seeded by its draw and
    row alone, so on a deterministic engine the trained rows equal one replica's."""
    streamer = {"make_streamer": lambda engine: FakeStreamer(engine)}
    one, two = run(2, **{"rollout": streamer}), run(2, placement=WIDE, rollout=streamer)
    for (a, _), (b, logged) in zip(one, two):
        for key in ("group", "response_ids", "rollout_logprobs", "policy_version_min"):
            assert a[key].tolist() == b[key].tolist(), key
        assert logged["buffer/dropped"] == 0


def test_partial_samples_more_than_k_versions_behind_are_dropped_as_on_the_local_executor():
    # test_streaming's scenario: request 2 (uid 1) is cut by the pauses after steps 0 and 1 and finishes under
    # version 2, request 3 is cut after step 0 and finishes under version 1; here the pauses come after the
    # consumers, with the same result: uid 1's samples (oldest token version 0) are dropped at step 2
    stall = {2: (1, 2), 3: (1, 1)}
    steps = run(3, rollout={"partial": True, "make_streamer": lambda engine: FakeStreamer(engine, stall.get)})
    assert [b["group"].unique_consecutive().tolist() for b, _ in steps] == [[0, 2], [3, 4], [5]]
    batch, logged = steps[2]
    assert logged["buffer/dropped"] == 2 and logged["buffer/staleness/mean"] == 1.5
    assert logged["buffer/staleness/max"] == 2 and logged["stream/mixed_versions"] == 2
    assert logged["stream/aborted"] == 2 and batch["policy_version"].tolist() == [1, 1]
