"""fl.buffer(stream=True) on the Ray executor (flowrl.runtime.ray_streaming): with the rollout on its own pool the
engine keeps sampling in the rollout worker while the actor trains, the weights of the next version are synced
into the paused engine, and rows carry the versions that sampled them.

Over the fakes: each generate call (a ThreadedStreamer batch of one group, 2 samples) takes 0.1 s, an update 1 s;
2 prompts a batch, k = 1, so step 0 draws 4 prompts and trains on the first 2 groups while the other 2 finish
during its update, under version 0; step 1 trains them at version 1 and draws 2 more, sampled under version 1.
"""

import dataclasses
from pathlib import Path

import pytest

import flowrl as fl
from flowrl.algorithms import grpo_async
from flowrl.config import RunConfig
from flowrl.data import PromptStream
from flowrl.runtime.factory import make_factory
from fakes import ROLE_CLASSES, FakeTokenizer, ParityTask, fake_specs
from test_ray_buffer import INPUTS, SPLIT

ray = pytest.importorskip("ray")
from flowrl.runtime.ray_executor import RayExecutor  # noqa: E402  (needs ray)


@pytest.fixture(scope="module", autouse=True)
def cluster(ray_local):
    """The session's local Ray cluster (conftest.ray_local); workers find `fakes` on PYTHONPATH."""


def executor(placement, **specs):
    plan = fl.compile_plan(grpo_async, placement, INPUTS, ROLE_CLASSES,
                           {"group_size": 2, "max_staleness": 1, "kl_coef": 0.0, "stream": True})
    factory = make_factory(RunConfig(), plan, ParityTask(), Path("unused"))
    return RayExecutor(plan, dataclasses.replace(factory, specs=fake_specs(**specs)))


def test_streamed_generation_runs_while_the_actor_trains():
    ex = executor(SPLIT, generate_s=0.1, update_s=1.0, stream_batch=2)
    prompts = PromptStream(ParityTask(), FakeTokenizer(), batch_size=2, seed=1)
    try:
        steps = [ex.run_step(step, prompts) for step in range(3)]
    finally:
        ex.close()
    versions = [(b["policy_version_min"].tolist(), b["policy_version_max"].tolist()) for b, _ in steps]
    assert versions == [([0] * 4, [0] * 4), ([0] * 4, [0] * 4), ([1] * 4, [1] * 4)]
    # step 0's last 2 groups (0.1 s each) finished during its 1 s update; step 1's draw finished during its own
    assert [logged["stream/done_while_training"] for _, logged in steps[:2]] == [2, 2]
    assert [logged["buffer/staleness/max"] for _, logged in steps] == [0, 1, 1]
    assert [logged["stream/wait_s"] < 0.5 for _, logged in steps[1:]] == [True, True]  # ready before the take
    for _, logged in steps:
        assert logged["buffer/dropped"] == 0 and logged["stream/aborted"] == 0
        assert {"reward/mean", "response_length/mean", "actor/pg_loss", "stream/in_flight"} <= set(logged)


def test_streaming_beside_the_consumers_is_refused_in_one_line():
    shared = fl.Placement(pools=[fl.Pool(name="all", roles=["actor", "rollout"])])
    with pytest.raises(fl.PlanError, match=r"^grpo_async: fl.buffer\(stream=True\) on the Ray executor needs rollout "
                                           r"on a pool of its own \(split placement; or train.executor=local\): pool "
                                           r"'all' also hosts actor$"):
        executor(shared)
    wide = fl.Placement(pools=[fl.Pool(name="train", roles=["actor"]),
                               fl.Pool(name="gen", roles=["rollout"], world_size=2)])
    with pytest.raises(fl.PlanError, match=r"^grpo_async: fl.buffer\(stream=True\) on the Ray executor streams from "
                                           r"one rank: pool 'gen' has world_size 2$"):
        executor(wide)
