"""Predicted step time: each node of the traced graph costed on its candidate pool, then the step simulated.

Node costs (seconds) come from the cost model's device row (flowrl.plan.costs): generation is decode steps
(per step a fixed overhead plus reading the weights and the KV cache at HBM bandwidth; static batches run to
the longest row, each step attending over the whole static cache (prompt + max_new_tokens slots a row) at an
overhead of `hf_static_step_s` plus `hf_static_row_s` a row; vLLM's continuous batching runs the rows' mean
tokens over its concurrent sequences, reading the tokens they hold, its overhead a decode step the device row's
`vllm_step_s` with CUDA graphs or `vllm_eager_step_s` eager), forward and update passes are 2 and 6 FLOPs per
parameter and token (8 with checkpointing) at the device's MFU (a no-grad forward at the prefill's,
`prefill_mfu`; an update at training's, `train_mfu`), plus offload traffic over PCIe; a weight sync moves the
weights over NVLink, the network or an in-process copy.
The step: nodes on one pool run one after another, nodes on different pools run together when the graph lets
them; with a buffer (fl.buffer, depth >= 1) on split pools the weight syncs run first, then the producers of
step t+1 overlap the consumers of step t, so the step takes the syncs and the slower side.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowrl.graph.trace import NodeKind
from flowrl.plan.candidates import Candidate, Work
from flowrl.plan.costs import CostModel
from flowrl.plan.memory import VLLM_MAX_NUM_SEQS, Fit
from flowrl.engines.memory import ModelShape, RankLoad, kv_cache


@dataclass(frozen=True)
class GraphNode:
    """A plan node as the simulator sees it: its cost category, its pool side and its predecessors."""

    name: str
    category: str  # generate, forward, update, sync, driver
    side: str  # "gen", "train" or "driver"
    deps: tuple[str, ...]
    before_buffer: bool = True


def node_seconds(node: GraphNode, cand: Candidate, shape: ModelShape, work: Work, costs: CostModel,
                 fit: Fit) -> float:
    d = costs.device
    peak = d.peak_tflops * 1e12 * (0.5 if shape.dtype_bytes == 4 else 1.0)
    if node.category == "generate":
        return costs.scaled("generate", generate_s(cand, shape, work, costs, fit))
    if node.category in ("forward", "update"):
        tokens = work.update_tokens() / cand.train_gpus
        micro = max(cand.token_budget, work.seq_len) if cand.token_budget else \
            cand.micro_batch_size // cand.train_gpus * work.seq_len
        # a no-grad forward over whole rows is a prefill's work: it runs at the prefill's MFU, an update at training's
        mfu = (d.prefill_mfu if node.category == "forward" else d.train_mfu) * micro / (micro + d.half_mfu_tokens)
        flops = (2 if node.category == "forward" else 6 + 2 * cand.gradient_checkpointing) * shape.compute_params()
        seconds = flops * tokens * work.epochs ** (node.category == "update") / (peak * mfu)
        if node.category == "update":
            seconds += offload_s(cand, shape, work, costs)
        return costs.scaled(node.category, seconds)
    if node.category == "sync":
        return costs.scaled("sync", sync_s(cand, shape, costs))
    return costs.scaled("driver", d.driver_row_s * work.rows)


def generate_s(cand: Candidate, shape: ModelShape, work: Work, costs: CostModel, fit: Fit) -> float:
    d, k = costs.device, cand.tensor_parallel
    rows = -(-work.rows // cand.replicas)
    if cand.engine == "vllm":
        concurrent = max(1, min(rows, VLLM_MAX_NUM_SEQS, fit.kv_tokens // work.seq_len))
        steps = max(work.response_len, rows * work.mean_response_len / concurrent)
        overhead = d.vllm_eager_step_s if cand.enforce_eager else d.vllm_step_s
        cached = work.prompt_len + work.mean_response_len / 2  # paged: a step reads the tokens its rows hold
    else:  # a static cache: every step attends over all of its slots, and costs more per row (sampling etc.)
        concurrent, steps, cached = rows, work.response_len, work.seq_len
        overhead = d.hf_static_step_s + rows * d.hf_static_row_s
    kv_token = kv_cache(shape, RankLoad(1, rows=1, seq_len=1, tokens=1))
    read = min(shape.num_params, shape.compute_params() * concurrent) * shape.dtype_bytes / k
    read += concurrent * cached * kv_token / k
    step = overhead + read / (d.hbm_gbs * 1e9) + (2e-5 * shape.num_layers if k > 1 else 0.0)
    prefill = 2 * shape.compute_params() * rows * work.prompt_len / (k * d.peak_tflops * 1e12 * d.prefill_mfu)
    return steps * step + prefill


def offload_s(cand: Candidate, shape: ModelShape, work: Work, costs: CostModel) -> float:
    d, shard = costs.device, shape.weight_bytes / cand.train_gpus
    steps = max(1, work.rows // work.mini_batch_size) * work.epochs
    seconds = 0.0
    if cand.offload_optimizer:
        seconds += steps * 2 * 2 * shard / (d.pcie_gbs * 1e9)  # AdamW's two moments in and out
    if cand.offload_params:
        per_micro = max(1, cand.token_budget // work.seq_len) * cand.train_gpus if cand.token_budget else \
            cand.micro_batch_size
        micros = work.rows * work.epochs / per_micro
        seconds += micros * 2 * shard / (d.pcie_gbs * 1e9)
        seconds += steps * shape.num_params / cand.train_gpus / (d.cpu_adam_gparams_s * 1e9)
    return seconds


def sync_s(cand: Candidate, shape: ModelShape, costs: CostModel) -> float:
    d = costs.device
    if cand.colocated:
        if cand.engine != "vllm":
            return 0.0 if cand.train_gpus == 1 else d.sync_fixed_s + shape.weight_bytes / (d.sync_gbs * 1e9)
        wake = 2 * shape.weight_bytes / cand.tensor_parallel / (d.pcie_gbs * 1e9) if cand.sleep_level == 1 else 0.0
        return d.sync_fixed_s + wake + shape.weight_bytes / cand.tensor_parallel / (d.sync_gbs * 1e9)
    return d.sync_fixed_s + shape.weight_bytes / (d.network_gbs * 1e9)


def step_seconds(nodes: list[GraphNode], seconds: dict[str, float], cand: Candidate, buffer_depth: int,
                 step_fixed_s: float) -> float:
    """The step: a list schedule (each side runs one node at a time, in trace order, after its
    predecessors). A buffer on split pools runs the weight syncs first, then the producers of step t+k beside
    the consumers of step t (flowrl.runtime.offpolicy.buffering), where the two share no pool."""
    if cand.colocated:
        return step_fixed_s + sum(seconds.values())
    if buffer_depth >= 1:
        syncs = [n for n in nodes if n.before_buffer and n.category == "sync"]
        producers = [n for n in nodes if n.before_buffer and n.category != "sync"]
        consumers = [n for n in nodes if not n.before_buffer]
        shared = {n.side for n in producers} & {n.side for n in consumers} - {"driver"}
        ahead, behind = makespan(producers, seconds), makespan(consumers, seconds)
        both = ahead + behind if shared else max(ahead, behind)
        return step_fixed_s + sum(seconds[n.name] for n in syncs) + both
    return step_fixed_s + makespan(nodes, seconds)


def makespan(nodes: list[GraphNode], seconds: dict[str, float]) -> float:
    finish: dict[str, float] = {}
    free: dict[str, float] = {}
    for node in nodes:
        ready = max([finish.get(dep, 0.0) for dep in node.deps] or [0.0])
        start = ready if node.side == "driver" else max(ready, free.get(node.side, 0.0))
        finish[node.name] = start + seconds[node.name]
        if node.side != "driver":
            free[node.side] = finish[node.name]
    return max(finish.values() or [0.0])


def graph_nodes(plan) -> tuple[list[GraphNode], int]:
    """The plan's nodes with their categories (from what the roles declare, never their names) and the
    buffer's depth (0: no buffer)."""
    out, depth, seen_buffer = [], 0, False
    for node in plan.nodes:
        deps = tuple(p for p in plan.graph.predecessors(node.name) if p in {n.name for n in plan.nodes})
        if node.kind is NodeKind.BUFFER:
            depth, seen_buffer = int(node.kwargs.get("max_staleness", 1)), True
            out.append(GraphNode(node.name, "driver", "driver", deps, False))
            continue
        spec = plan.specs.get(node.role) if node.role else None
        if spec is None or node.role not in plan.pools:
            category, side = "driver", "driver"
        elif node.kind is NodeKind.SYNC:
            category, side = "sync", "gen"
        elif spec.weights_from is not None and not spec.trainable:
            category, side = "generate", "gen"
        elif spec.trainable and not spec.methods()[node.method].resolve(node.kwargs)[1]:
            category, side = "update", "train"  # a trained role's method that writes nothing: its update
        else:
            category, side = "forward", "train"
        out.append(GraphNode(node.name, category, side, deps, not seen_buffer))
    return out, depth
