"""Planner passes: the micro-batch token budget chosen from memory, and the buffer's depth for split layouts."""

import dataclasses

from flowrl.plan.candidates import Candidate, Work
from flowrl.plan.cluster import ClusterConfig
from flowrl.plan.memory import Roles, fit
from flowrl.plan.passes import buffer_depth, token_budget
from flowrl.plan.simulate import GraphNode
from flowrl.algorithms import grpo
from flowrl.plan.candidates import Space
from flowrl.plan.choose import PlannerConfig
from flowrl.plan.costs import CostModel
from test_planner_choice import BATCH, GRPO_ROLES, WORK, _nodes, shape


def test_the_token_budget_is_the_largest_power_of_two_that_fits():
    one, s = ClusterConfig.parse("1xH100-80G"), shape("7B")
    nodes, depth = _nodes(grpo)
    cand = PlannerConfig().build().choose(nodes, depth, s, WORK, GRPO_ROLES, one, Space(), BATCH,
                                          CostModel(one.kind)).best.cand  # checkpointing and optimizer offload
    budget = token_budget(cand, s, WORK, GRPO_ROLES, one, BATCH, 0.95)
    limit = int(0.95 * one.gpu_bytes)
    assert budget >= 2048 and budget & (budget - 1) == 0  # at least one 1280-token sequence, a power of two
    assert fit(dataclasses.replace(cand, token_budget=budget), s, WORK, GRPO_ROLES, one, BATCH).fits(limit)
    assert not fit(dataclasses.replace(cand, token_budget=2 * budget), s, WORK, GRPO_ROLES, one, BATCH).fits(limit)
    # a small model: capped at twice a rank's whole share of the step (128 rows x 1280 tokens on 8 ranks = 20480)
    eight = ClusterConfig.parse("8xH100-80G")
    small = token_budget(Candidate(8, 0, gradient_checkpointing=True, micro_batch_size=64), shape("0.5B"), WORK,
                         Roles(compile=True), eight, BATCH, 0.95)
    assert small == 32768  # the powers of two from 2048 up to 2 x 20480


def test_the_buffer_depth_hides_the_slowest_generation():
    gen = GraphNode("g", "generate", "gen", ())
    sync = GraphNode("s", "sync", "gen", ())
    upd = GraphNode("u", "update", "train", ("g",), before_buffer=False)
    split, work = Candidate(4, 4), Work(rows=8, prompt_len=0, response_len=1000, mean_response_len=250,
                                        mini_batch_size=8)
    nodes = [sync, gen, upd]
    assert buffer_depth(nodes, {"s": 1.0, "g": 3.0, "u": 2.0}, split, work, 4) == 1  # generation-bound
    # training 5 s, generation 2 s on mean rows and 4 x 2 = 8 s with every row at max: ceil(8 / 5) = 2 batches
    assert buffer_depth(nodes, {"s": 1.0, "g": 2.0, "u": 5.0}, split, work, 4) == 2
    assert buffer_depth(nodes, {"s": 1.0, "g": 2.0, "u": 1.0}, split, work, 4) == 1  # generation-bound again
    assert buffer_depth(nodes, {"s": 0.0, "g": 2.0, "u": 2.5}, split, work, 1) == 1  # what the user allows
    assert buffer_depth(nodes, {"s": 0.0, "g": 2.0, "u": 5.0}, Candidate(8, 0), work, 4) == 0  # one pool
