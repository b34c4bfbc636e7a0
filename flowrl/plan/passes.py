"""Planner passes after the choice: the micro-batch token budget from memory, and the buffer's depth.

`token_budget`: the largest power-of-two budget of tokens per micro-batch and rank (the train engines'
`max_tokens_per_micro_batch`: rows are grouped up to it, a longer row runs alone) whose update still fits the
card beside everything else the pool holds, from one sequence up to a rank's whole share of the step.
flowrl.runtime.layout.auto_plan rescores the chosen layout under it (its peak and step time, as plan.predicted has
them) and keeps it where it is predicted no slower than the layout's rows per micro-batch.

`buffer_depth`: for split pools with an `fl.buffer`, how many batches the producers may run ahead. Producer-bound
steps (generation as slow as training or slower) gain nothing past 1. Where training is slower, the buffer must
hide the slowest generation, every row at max_new_tokens: ceil(that / the consumers' seconds) batches, at most
`max_depth` (deeper means staler rows: the planner stays within what the user allows).
Advice only: a graph's buffer depth is `fl.buffer(max_staleness=k)`, an int fixed when the algorithm is
traced (grpo_async takes it from its option algo.max_staleness); the graph API has no depth left to the
planner and the planner cannot tell which option feeds it, so `flowrl plan` prints the depth and the user sets
the option (it changes which weights sampled the rows: the math).
"""

from __future__ import annotations

import math
from dataclasses import replace

from flowrl.plan.candidates import Candidate, Work
from flowrl.plan.cluster import ClusterConfig
from flowrl.engines.memory import ModelShape
from flowrl.plan.memory import Roles, fit
from flowrl.plan.simulate import GraphNode


def token_budget(cand: Candidate, shape: ModelShape, work: Work, roles: Roles, cluster: ClusterConfig,
                 batch: dict[str, int], headroom: float) -> int:
    """The largest power-of-two token budget (at least one sequence) with which the candidate still fits; 0 where
    not even one sequence does."""
    limit, budget, best = int(cluster.gpu_bytes * headroom), 1 << math.ceil(math.log2(work.seq_len)), 0
    most = -(-work.rows // cand.train_gpus) * work.seq_len
    while budget <= 2 * most:
        if not fit(replace(cand, token_budget=budget), shape, work, roles, cluster, batch).fits(limit):
            break
        best, budget = budget, budget * 2
    return best


def buffer_depth(nodes: list[GraphNode], seconds: dict[str, float], cand: Candidate, work: Work,
                 max_depth: int) -> int:
    """Batches in flight for a split layout with a buffer (0 on one pool: nothing to overlap)."""
    if cand.colocated or max_depth < 1:
        return 0
    produce = sum(seconds[n.name] for n in nodes if n.before_buffer and n.category != "sync")
    consume = sum(seconds[n.name] for n in nodes if not n.before_buffer)
    if produce >= consume or consume <= 0:
        return 1
    tail = work.response_len / max(work.mean_response_len, 1.0)  # every row at max_new_tokens
    slowest = sum(seconds[n.name] * (tail if n.category == "generate" else 1.0)
                  for n in nodes if n.before_buffer and n.category != "sync")
    return max(1, min(max_depth, math.ceil(slowest / consume)))
