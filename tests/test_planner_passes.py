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
from flowrl.engines.memory import GIB
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


def test_the_update_under_a_token_budget_and_checkpointing_by_hand():
    """7B (h 3584, i 18944, 28 layers, vocab 152064, bf16) on one H100, checkpointing and the optimizer offloaded,
    eager: one micro-batch of B tokens holds B x (28 x 2 x 3584 + 24 x 3584 + 8 x 18944) = B x 438272 bytes of
    activations (the layers' inputs and the one layer recomputed in full) and 3 x 4096 x 152064 x 4 bytes of
    logits (4096-token chunks); the optimizer step holds weights, gradients and both moments, nothing else."""
    from flowrl.plan.memory import train_phases

    s, roles = shape("7B"), Roles(trained=1, frozen=1, compile=False)
    w = 7_615_616_512 * 2  # the weights' bytes
    cand = Candidate(1, 0, gradient_checkpointing=True, offload_optimizer=True, token_budget=32768)
    got = train_phases(cand, s, WORK, roles)
    assert got["resident"] == 2 * w  # the actor's weights and the reference's (its moments wait on the CPU)
    assert got["update"] == 2 * w + w + 32768 * 438272 + 3 * 4096 * 152064 * 4
    assert got["optimizer step"] == 2 * w + w + 2 * w
    # a row longer than the budget runs alone: a budget below one 1280-token row counts the row (and its logits
    # are under one 4096-token chunk)
    assert train_phases(dataclasses.replace(cand, token_budget=512), s, WORK, roles)["update"] == \
        3 * w + 1280 * 438272 + 3 * 1280 * 152064 * 4
    # rows instead of a budget: 16 rows of 1280 tokens
    rows = train_phases(dataclasses.replace(cand, token_budget=0, micro_batch_size=16), s, WORK, roles)
    assert rows["update"] == 3 * w + 16 * 1280 * 438272 + 3 * 4096 * 152064 * 4


def test_the_predicted_peak_under_the_token_budget_is_the_fake_engines_peak():
    """The chosen layout with its token budget, run on the fake engines (tests/fake_cluster.py: the engines' own
    estimate under max_tokens_per_micro_batch, held when the run holds it): the predicted peak is within 15% of
    the simulated GPU's, nothing runs out of memory, and a budget twice as large would not have fit."""
    import fake_cluster as fc
    from flowrl.algorithms import grpo as algo
    from test_planner_bars import model, true_device

    for name, spec in (("7B", "1xH100-80G"), ("1.5B", "1xH100-80G"), ("0.5B", "8xH100-80G")):
        cluster, s = ClusterConfig.parse(spec), model(name)
        nodes, depth = _nodes(algo)
        planner, costs = PlannerConfig().build(), CostModel(cluster.kind)
        best = planner.choose(nodes, depth, s, WORK, GRPO_ROLES, cluster, Space(), BATCH, costs).best
        budget = token_budget(best.cand, s, WORK, GRPO_ROLES, cluster, BATCH, 0.95)
        assert budget > 0
        budgeted = planner.score(dataclasses.replace(best.cand, token_budget=budget), nodes, depth, s, WORK,
                                 GRPO_ROLES, cluster, BATCH, costs)
        case = fc.Case(algo, None, s, WORK, GRPO_ROLES, true_device(spec, 0))
        rows = fc.run_layout(case, budgeted.cand, budgeted.fit, cluster.gpu_bytes)  # fc.OutOfMemory past the card
        for pool, peak in budgeted.fit.peak.items():
            seen = max(r[f"memory/peak_gib/{pool}"] for r in rows)
            assert abs(peak / GIB - seen) <= 0.15 * seen, (name, pool, peak / GIB, seen)
        bigger = dataclasses.replace(budgeted.cand, token_budget=2 * budget)
        if 2 * budget <= 2 * -(-WORK.rows // best.cand.train_gpus) * WORK.seq_len:  # within the pass's range
            assert not fit(bigger, s, WORK, GRPO_ROLES, cluster, BATCH).fits(int(0.95 * cluster.gpu_bytes))
