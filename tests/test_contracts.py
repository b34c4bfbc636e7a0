"""Node contracts at run time, distinct metric names for repeated calls, and scheduling from the plan's edges."""

import pytest
import torch

import flowrl as fl
from flowrl.data.prompts import PromptStream
from flowrl.engines.protocols import FinishReason
from flowrl.errors import GraphError
from flowrl.graph.role import graph_method, role
from fakes import ROLE_CLASSES, FakeTokenizer, ParityTask
from test_planner_executor import INPUTS, make_roles


def run_once(algo, roles=None, placement=("actor", "rollout"), batch_size=3):
    plan = fl.compile_plan(algo, fl.Placement.colocated(placement), INPUTS, ROLE_CLASSES)
    executor = fl.LocalExecutor(plan, roles or make_roles())
    return executor.run_step(0, PromptStream(ParityTask(), FakeTokenizer(), batch_size=batch_size, seed=1))


@fl.stage(reads=("scores",), writes=("advantages",))
def reads_undeclared(batch):
    batch["advantages"] = batch["scores"][:, None] * batch["response_mask"]  # response_mask is not declared
    return batch


@fl.stage(reads=("scores", "response_mask"), writes=("advantages",))
def misspelled_write(batch):
    batch["advantage"] = batch["scores"][:, None] * batch["response_mask"]
    return batch


@fl.stage(reads=("scores",), writes=())
def overwrites_a_read(batch):
    batch["scores"] = batch["scores"] * 2
    return batch


def graph_with(stage):
    @fl.algorithm
    def algo(batch, rollout, reward):
        batch = rollout.generate(batch, n=2)
        batch = reward.score(batch)
        return stage(batch)

    return algo


@pytest.mark.parametrize("stage, message", [
    (reads_undeclared, "stage reads_undeclared reads 'response_mask', which it does not declare; its reads are "
                       r"\['scores'\]"),
    (misspelled_write, "stage misspelled_write writes 'advantage', which it does not declare; its writes are "
                       r"\['advantages'\]"),
    (overwrites_a_read, r"stage overwrites_a_read writes 'scores', which it does not declare; its writes are \[\]"),
])
def test_a_stage_touching_an_undeclared_field_fails_at_the_first_step(stage, message):
    with pytest.raises(GraphError, match=message):
        run_once(graph_with(stage), placement=("rollout",))


def test_a_stage_that_keeps_its_contract_runs_on_its_declared_reads_only():
    seen = []

    @fl.stage(reads=("scores", "group"), writes=("advantages",))
    def spy(batch):
        seen.append(sorted(batch.keys()))
        batch["advantages"] = batch["scores"]
        return batch

    batch, _ = run_once(graph_with(spy), placement=("rollout",))
    assert seen == [["group", "scores"]] and torch.equal(batch["advantages"], batch["scores"])
    assert "response_ids" in batch.keys()  # the rest of the batch is untouched


def test_a_row_changing_stage_changes_every_field_the_same_way():
    @fl.stage(reads=("scores",), rows=True)
    def keep_odd_rows(batch):
        return batch[1::2]

    full, _ = run_once(graph_with(fl.stage(reads=(), writes=())(lambda b: b)), placement=("rollout",))
    kept, _ = run_once(graph_with(keep_odd_rows), placement=("rollout",))
    for key in ("response_ids", "scores", "group", "prompt_ids"):
        assert torch.equal(kept[key], full[key][1::2]), key
    assert kept["answer"].tolist() == full["answer"].tolist()[1::2]


@role("leaky_judge", on_driver=True)
class LeakyJudge:
    @graph_method(reads=("response_ids",), writes=("judge_scores",))
    def score(self, batch):
        batch["judge_score"] = torch.zeros(batch.batch_size[0])
        return batch


def test_a_role_method_writing_an_undeclared_field_fails_naming_it():
    @fl.algorithm
    def algo(batch, rollout, leaky_judge):
        batch = rollout.generate(batch)
        return leaky_judge.score(batch)

    plan = fl.compile_plan(algo, fl.Placement.colocated(("rollout",)), INPUTS)
    roles = {"rollout": make_roles()["rollout"], "leaky_judge": LeakyJudge()}
    with pytest.raises(GraphError, match="leaky_judge.score writes 'judge_score', which it does not declare"):
        fl.LocalExecutor(plan, roles).run_step(0, PromptStream(ParityTask(), FakeTokenizer(), batch_size=2))


def test_repeated_calls_of_one_method_log_under_distinct_names():
    @fl.algorithm
    def twice(batch, rollout, reward):
        batch = rollout.generate(batch)
        batch = reward.score(batch, metric="first")
        batch = rollout.generate(batch, n=3)
        return reward.score(batch, metric="second")

    _, logged = run_once(twice, placement=("rollout",))
    assert "response_length/mean" in logged and "response_length/mean#2" in logged
    assert "timing_s/rollout.generate" in logged and "timing_s/rollout.generate#2" in logged
    assert set(k for k in logged if k.startswith("first") or k.startswith("second")) == {"first/mean", "second/mean"}


def test_generation_writes_the_sampler_logprobs_finish_reason_loss_mask_and_policy_version():
    from flowrl.algorithms import grpo

    roles = make_roles()
    plan = fl.compile_plan(grpo.options(group_size=2), fl.Placement.colocated(("actor", "rollout", "ref")), INPUTS,
                           ROLE_CLASSES, {"group_size": 2})
    executor = fl.LocalExecutor(plan, roles)
    stream = PromptStream(ParityTask(), FakeTokenizer(), batch_size=2, seed=1)
    versions = [executor.run_step(step, stream)[0]["policy_version"].tolist() for step in range(3)]
    assert versions == [[0] * 4, [1] * 4, [2] * 4]  # each step samples with the weights of the update before it
    batch, _ = executor.run_step(3, stream)
    assert torch.equal(batch["loss_mask"], batch["response_mask"])
    assert torch.equal(batch["rollout_logprobs"], -0.1 * batch["response_ids"].float())  # the fake sampler's
    assert (batch["finish_reason"] == FinishReason.STOP).all()


def test_a_node_waits_for_every_earlier_reader_of_a_field_it_overwrites():
    @fl.stage(reads=("scores",), writes=("advantages",))
    def reader(batch):
        return batch

    @fl.stage(reads=(), writes=("scores",))
    def overwriter(batch):
        return batch

    @fl.algorithm
    def algo(batch, rollout, reward, actor):
        batch = rollout.generate(batch)
        batch = reward.score(batch)
        batch = actor.logprobs(batch)
        batch = reader(batch)
        return overwriter(batch)

    graph, _ = algo.trace(INPUTS, ROLE_CLASSES)
    assert graph.has_edge("reader", "overwriter")  # write after read
    assert graph.has_edge("reward.score", "overwriter")  # write after write
    assert not graph.has_edge("actor.logprobs", "overwriter")  # independent: may run at once
