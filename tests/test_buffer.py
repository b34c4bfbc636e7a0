"""Bounded staleness (fl.buffer): k = 0 is today's step; k >= 1 lags the sampling weights by k versions, drops
older rows, and resumes exactly from a checkpoint holding buffered batches."""

import pytest
import torch
from tensordict import TensorDict

import flowrl as fl
from flowrl.algorithms import grpo, grpo_async
from flowrl.config import load_run_config
from flowrl.data import PromptStream
from flowrl.rl import losses, stages
from flowrl.runtime.offpolicy.buffering import drop_stale
from flowrl.runtime.trainer import train
from fakes import ROLE_CLASSES, FakeTokenizer, ParityTask
from test_planner_executor import make_roles
from crash import train_until_crash

INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer"}
COLOCATED = fl.Placement.colocated(("actor", "rollout", "ref"))
OFF = {"is_level": "off"}  # grpo's default rollout correction, for comparisons with it


def executor(algo, cfg, placement=COLOCATED):
    return fl.LocalExecutor(fl.compile_plan(algo, placement, INPUTS, ROLE_CLASSES, cfg), make_roles())


def run(algo, cfg, steps, placement=COLOCATED):
    ex = executor(algo, cfg, placement)
    stream = PromptStream(ParityTask(), FakeTokenizer(), batch_size=2, seed=1)
    return ex, [ex.run_step(step, stream) for step in range(steps)]


def untimed(logged):
    return {k: v for k, v in logged.items() if not k.startswith("timing_s/")}


def test_drop_stale_keeps_rows_at_most_k_versions_behind():
    batch = TensorDict({"policy_version": torch.tensor([0, 1, 2, 3]), "x": torch.arange(4)}, batch_size=[4])
    kept, logged = drop_stale(batch, "policy_version", version=3, max_staleness=1)
    assert kept["x"].tolist() == [2, 3] and kept["trained_version"].tolist() == [3, 3]
    # staleness [3, 2, 1, 0]: two rows more than one version behind; one kept row at 0, one at 1
    assert logged == {"buffer/dropped": 2.0, "buffer/staleness/mean": 1.5, "buffer/staleness/max": 3.0,
                      "buffer/rows_staleness_0": 1.0, "buffer/rows_staleness_1": 1.0}
    kept, logged = drop_stale(batch, "policy_version", version=3, max_staleness=3)
    assert kept["x"].tolist() == [0, 1, 2, 3] and logged["buffer/dropped"] == 0.0
    assert [logged[f"buffer/rows_staleness_{s}"] for s in range(4)] == [1.0] * 4
    assert "trained_version" not in batch.keys()  # the caller's batch is left as it was


def test_max_staleness_0_is_the_synchronous_step_exactly():
    _, plain = run(grpo, {"group_size": 2}, 3)
    ex, buffered = run(grpo_async, {"group_size": 2, "max_staleness": 0, "rollout_correction": OFF}, 3)
    assert ex.pipeline is None and any(n.kind is fl.graph.NodeKind.BUFFER for n in ex.nodes)
    for (a, a_logged), (b, b_logged) in zip(plain, buffered):
        assert set(a.keys()) == set(b.keys())
        for key in (k for k in a.keys() if isinstance(a[k], torch.Tensor)):  # old_logprobs: NaN, deferred
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, equal_nan=True)
        assert untimed(a_logged) == untimed(b_logged)


@pytest.mark.parametrize("k, versions", [(1, [0, 0, 1, 2, 3]), (2, [0, 0, 0, 1, 2])])
def test_rows_trained_at_step_t_were_sampled_k_versions_earlier(k, versions):
    ex, steps = run(grpo_async, {"group_size": 2, "max_staleness": k}, 5)
    assert [b["policy_version"].unique().tolist() for b, _ in steps] == [[v] for v in versions]
    assert [logged["buffer/staleness/max"] for _, logged in steps] == [min(t, k) for t in range(5)]
    assert all(logged["buffer/dropped"] == 0 for _, logged in steps)
    # each row records the weights that sampled it and those it trained: step t trains version t
    assert [(b["trained_version"] - b["policy_version"]).tolist() for b, _ in steps] == [[min(t, k)] * 4
                                                                                         for t in range(5)]
    assert ex.roles["actor"].version == 5 and [s for s in (p.step for p in ex.pipeline.queue)] == list(range(5, 5 + k))
    # a batch is seeded as the step that trains on it: step 0's equals the synchronous run's
    _, plain = run(grpo, {"group_size": 2}, 1)
    assert torch.equal(steps[0][0]["response_ids"], plain[0][0]["response_ids"])
    assert "reward/mean" in steps[3][1] and "timing_s/produce" in steps[3][1]


@fl.algorithm
def two_updates(batch, actor, rollout, reward):
    batch = rollout.generate(batch, n=2)
    batch = reward.score(batch)
    batch = fl.buffer(batch, max_staleness=1)
    batch = stages.group_advantage(actor.logprobs(batch))
    batch = actor.update(batch, loss=losses.clip_higher_loss())
    return actor.update(batch, loss=losses.clip_higher_loss())


def test_rows_more_than_k_versions_old_are_dropped_and_counted():
    # two updates a step: a batch sampled a step earlier lags by 2 > 1 and is dropped whole; the step skips,
    # so the next batch (sampled after it) is fresh again
    ex, steps = run(two_updates, None, 4, placement=fl.Placement.colocated(("actor", "rollout")))
    assert [logged["buffer/dropped"] for _, logged in steps] == [0, 4, 0, 4]
    assert [logged.get("buffer/skipped_step", 0) for _, logged in steps] == [0, 1, 0, 1]
    assert ex.roles["actor"].version == 4 and len(ex.roles["actor"].engine.updates) == 4


def test_a_buffer_after_fill_or_twice_or_with_a_bad_k_is_refused():
    @fl.algorithm
    def late_fill(batch, actor, rollout, reward):
        batch = fl.buffer(reward.score(rollout.generate(batch, n=2)), max_staleness=1)
        batch = fl.fill(stages.drop_uniform_groups(batch))
        return actor.update(stages.group_advantage(actor.logprobs(batch)), loss=losses.clip_higher_loss())

    @fl.algorithm
    def twice(batch, rollout, reward):
        batch = fl.buffer(reward.score(rollout.generate(batch)), max_staleness=1)
        return fl.buffer(batch, max_staleness=1)

    placement = fl.Placement.colocated(("actor", "rollout"))
    with pytest.raises(fl.PlanError, match="late_fill: _fill comes after buffer; fill re-runs the nodes before it"):
        fl.compile_plan(late_fill, placement, INPUTS, ROLE_CLASSES)
    with pytest.raises(fl.PlanError, match=r"at most one buffer node per step, got \['buffer', 'buffer#2'\]"):
        fl.compile_plan(twice, fl.Placement.colocated(("rollout",)), INPUTS, ROLE_CLASSES)

    @fl.algorithm
    def negative(batch, rollout):
        return fl.buffer(rollout.generate(batch), max_staleness=-1)

    with pytest.raises(fl.GraphError, match="buffer: max_staleness must be an int >= 0, got -1"):
        fl.compile_plan(negative, fl.Placement.colocated(("rollout",)), INPUTS, ROLE_CLASSES)


def config(tmp_path, *overrides):
    return load_run_config(None, [f"train.output_dir={tmp_path}", "train.batch_size=4", "algo.group_size=4",
                                  "eval.every=0", "checkpoint.export=false", *overrides])


def test_on_the_real_engines_k0_equals_grpo_and_k1_resumes_exactly(tmp_path):
    plain = train(config(tmp_path / "grpo", "train.steps=2"), progress=False)
    zero = train(config(tmp_path / "k0", "train.steps=2", "algorithm=grpo_async", "algo.max_staleness=0",
                        "algo.rollout_correction.is_level=off"), progress=False)
    assert [untimed(r) for r in zero] == [untimed(r) for r in plain]

    async_ = ["algorithm=grpo_async", "train.steps=4", "checkpoint.every=2"]
    straight = train(config(tmp_path / "a", *async_), progress=False)
    assert [r["buffer/staleness/max"] for r in straight] == [0, 1, 1, 1]
    assert all(r["actor/rollout/is_weight_mean"] > 0 for r in straight)  # the sampler's logprobs weight the loss

    train_until_crash(config(tmp_path / "b", *async_), 3)
    assert (tmp_path / "b" / "checkpoints" / "step_000002" / "_buffer" / "buffer.pt").exists()
    resumed = train(config(tmp_path / "b", *async_), progress=False)
    assert [row["step"] for row in resumed] == [3, 4]
    assert [untimed(r) for r in resumed] == [untimed(r) for r in straight[2:]]


def test_producers_overlap_consumers_only_on_pools_of_their_own():
    from flowrl.runtime.offpolicy import buffering
    from flowrl.runtime.scheduling import scheduled

    cfg = {"group_size": 2, "max_staleness": 1, "kl_coef": 0.0}
    split = fl.Placement(pools=[fl.Pool(name="train", roles=["actor"]), fl.Pool(name="gen", roles=["rollout"])])
    for placement, overlaps in ((split, True), (fl.Placement.colocated(("actor", "rollout")), False)):
        plan = fl.compile_plan(grpo_async, placement, INPUTS, ROLE_CLASSES, cfg)
        s = buffering.split(plan, scheduled(plan))
        assert [n.name for n in s.syncs] == ["rollout.sync_weights"] and s.source == "actor"
        assert [n.name for n in s.producers] == ["rollout.generate", "reward.score"]
        assert buffering.can_overlap(plan, s) is overlaps
