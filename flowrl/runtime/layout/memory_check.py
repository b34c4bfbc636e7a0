"""`flowrl train`'s memory check (train.device=cuda, train.memory_check) and `flowrl plan --gpus N`'s table.

One memory model: the run's configured layout (flowrl.config.candidate) is judged by the planner's phase
model (flowrl.plan.memory: generation with vLLM's pre-allocation and sleep levels, the train phases with
checkpointing, offload, token budgets and the logits), the one `flowrl plan --cluster --explain` and
placement=auto choose with, within the planner's headroom of a card. A layout an engine would refuse at build
(a tensor_parallel_size that does not divide the pool or the heads, vLLM's share not free beside the train
engines) is refused with that engine's reason before anything loads; one that does not fit is refused naming
the pool, its predicted peak, the card's memory and every smallest set of flowrl's own options with which it
fits (`fixes`). A layout the Candidate cannot express is said so in one warning and judged by the per-role sum
of flowrl.plan.resources instead.
"""

from __future__ import annotations

import itertools
import json
import os
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from flowrl.config import RunConfig
from flowrl.engines.memory import GIB, ModelShape
from flowrl.errors import PlanError
from flowrl.plan.candidates import Candidate, Work
from flowrl.plan.choose import PlannerConfig
from flowrl.plan.memory import Fit, fit, pool_phases
from flowrl.plan.planner import Plan
from flowrl.plan.resources import Workload, check_fits, describe, estimate
from flowrl.config.candidate import Layout, Unexpressible, batch_sizes, configured, engines, workload

CHOOSES = "(`flowrl plan ALGO --cluster found --explain` chooses among them)"  # after a refusal's advice

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True)
class Judged:
    """What the check found: per pool of the run, the phases' bytes per GPU (or, where the layout fell back to
    the per-role sum, each role's components) and one line per pool."""

    per_gpu: dict[str, dict[str, dict[str, int] | int]]
    table: str
    peak: int = 0  # the highest predicted bytes per GPU (the phase model's; 0 on the fallback)


def judge(cfg: RunConfig, plan: Plan, shape: ModelShape, prompt_len: int, gpu_bytes: int,
          gpus_per_node: int | None = None) -> Judged:
    """The run's layout judged on GPUs of `gpu_bytes`: a PlanError (one line) where it does not fit or an engine
    would refuse it; else its predicted bytes per GPU."""
    work = workload(cfg, plan, prompt_len)
    try:
        layout = configured(cfg, plan, gpu_bytes, gpus_per_node)
    except Unexpressible as why:
        warnings.warn(f"memory check: {why}; judged by the per-role sum (flowrl.plan.resources) instead of the "
                      f"planner's phase model", stacklevel=3)
        return fallback(cfg, plan, shape, work.seq_len, gpu_bytes)
    got = fit(layout.cand, shape, work, layout.roles, layout.cluster, layout.batch)
    limit = int(gpu_bytes * PlannerConfig().headroom)
    if got.refused:  # an engine's refusal for want of memory (vLLM's share not free, no room for a sequence's
        # KV cache) names what would make room as a peak over the card does; one for the layout (TP, nodes) cannot
        found = "" if got.layout_refused or not (sets := fixes(layout, shape, work, limit)) else \
            f"; it would fit with {named(sets)} {CHOOSES}"
        raise PlanError(f"placement: {got.refused}{found}")
    if max(got.peak.values()) > limit:
        raise PlanError(f"{too_big(layout, got, gpu_bytes)}; it would fit with {advice(layout, shape, work, limit)} "
                        f"{CHOOSES}")
    phases = pool_phases(layout.cand, shape, work, layout.roles, gpu_bytes, layout.cluster.kind)[0]
    per_gpu = {layout.pools[pool]: each for pool, each in phases.items()}
    sizes = {layout.pools[pool]: layout.cand.train_gpus if pool != "gen" else layout.cand.rollout_gpus
             for pool in phases}
    lines = [f"memory per GPU (the planner's phase model; layout {layout.cand.label()}):"]
    for name, each in per_gpu.items():
        top = max(each, key=each.get)
        lines.append(f"  pool {name} ({sizes[name]} x cuda): peak {each[top] / GIB:.3g} GiB ({top}); "
                     + ", ".join(f"{phase} {b / GIB:.3g}" for phase, b in each.items()))
    return Judged(per_gpu, "\n".join(lines), max(got.peak.values()))


def too_big(layout: Layout, got: Fit, gpu_bytes: int) -> str:
    pool = max(got.peak, key=got.peak.get)
    return (f"placement: pool {layout.pools[pool]!r} needs about {got.peak[pool] / GIB:.1f} GiB per GPU at its "
            f"peak (predicted for {layout.cand.label()}), more than {PlannerConfig().headroom:.0%} of a GPU's "
            f"{gpu_bytes / GIB:.1f} GiB")


def advice(layout: Layout, shape: ModelShape, work: Work, limit: int) -> str:
    found = fixes(layout, shape, work, limit)
    return named(found) if found else "none of flowrl's memory options alone"


def named(found: list[list[str]]) -> str:
    return "; or ".join(" + ".join(f) for f in found)


def fixes(layout: Layout, shape: ModelShape, work: Work, limit: int) -> list[list[str]]:
    """The smallest sets of `--set` values with which the layout fits `limit` bytes a GPU, in the phase model:
    activation checkpointing, the optimizer or parameters offloaded, LoRA on the policy (it changes the math:
    offered, never applied), a token budget per micro-batch, vLLM asleep between generations or without its CUDA
    graph pool (enforce_eager). A set is found with the budget of one sequence a micro-batch and named with the
    largest power of two that still fits beside the rest of the set (`largest_budget`): the fewest micro-batches,
    the one a user following the advice should run."""
    cand, trained, tuned = layout.cand, layout.trained, layout.trained + layout.frozen
    budget = 1 << (work.seq_len - 1).bit_length()  # the smallest power of two that holds one sequence
    by_budget = " + ".join(f"roles.{r}.max_tokens_per_micro_batch={budget}" for r in tuned)
    sets = {"model.gradient_checkpointing=true": ({"gradient_checkpointing": True}, not cand.gradient_checkpointing),
            " + ".join(f"roles.{r}.offload_optimizer=true" for r in trained):
                ({"offload_optimizer": True}, bool(trained) and not cand.offload_optimizer),
            " + ".join(f"roles.{r}.offload_params=true" for r in trained):
                ({"offload_params": True, "offload_optimizer": False}, bool(trained) and not cand.offload_params),
            f"roles.{layout.policy}.lora_rank=64":
                ({"lora_rank": 64}, layout.policy in trained and not cand.lora_rank),
            by_budget:
                ({"token_budget": budget}, bool(tuned) and not 0 < cand.token_budget <= budget),
            f"roles.{layout.follower}.free_cache_engine=1":
                ({"sleep_level": 1}, cand.engine == "vllm" and cand.colocated and not cand.sleep_level),
            f"roles.{layout.follower}.enforce_eager=true":
                ({"enforce_eager": True}, cand.engine == "vllm" and not cand.enforce_eager)}
    options = {name: update for name, (update, offered) in sets.items() if offered}
    found: list[frozenset[str]] = []
    for size in range(1, len(options) + 1):
        for combo in itertools.combinations(options, size):
            if any(f <= set(combo) for f in found):
                continue
            changed = replace(cand, **{k: v for name in combo for k, v in options[name].items()})
            if fits(layout, changed, shape, work, limit):
                found.append(frozenset(combo))
    out = []
    for f in found:
        names = [name for name in options if name in f]
        if by_budget in f:
            changed = replace(cand, **{k: v for name in f for k, v in options[name].items()})
            most = largest_budget(layout, changed, shape, work, limit, budget)
            names[names.index(by_budget)] = by_budget.replace(f"={budget}", f"={most}")
        out.append(names)
    return out


def largest_budget(layout: Layout, cand: Candidate, shape: ModelShape, work: Work, limit: int, least: int) -> int:
    """The largest power-of-two token budget, from `least` (one sequence, known to fit) up to the step's tokens,
    with which `cand` fits `limit` bytes a GPU."""
    most = least
    while most < work.rows * work.seq_len and fits(layout, replace(cand, token_budget=2 * most), shape, work, limit):
        most *= 2
    return most


def fits(layout: Layout, cand: Candidate, shape: ModelShape, work: Work, limit: int) -> bool:
    """Whether `cand`, one of `fixes`' variants of the layout's own, fits `limit` bytes a GPU in the phase model
    (under LoRA the frozen roles read the policy's base weights instead of loading their own)."""
    roles = replace(layout.roles, frozen_lent=layout.roles.frozen_lent or cand.lora_rank > 0)
    return fit(cand, shape, work, roles, layout.cluster, layout.batch).fits(limit)


def fallback(cfg: RunConfig, plan: Plan, shape: ModelShape, seq_len: int, gpu_bytes: int) -> Judged:
    """The per-role sum (flowrl.plan.resources), for a layout the planner's Candidate cannot express."""
    work = Workload(rows=cfg.train.batch_size * max([n.row_multiplier() for n in plan.nodes] or [1]),
                    micro_batch_size=batch_sizes(cfg, plan)["micro_batch_size"], seq_len=seq_len,
                    gradient_checkpointing=cfg.model.gradient_checkpointing)
    per_gpu = estimate(plan, shape, work, engines(cfg, plan))
    check_fits(plan, per_gpu, gpu_bytes)
    return Judged(per_gpu, describe(per_gpu, {pool.name: pool for pool in plan.pools.values()}))


def check_run(cfg: RunConfig, plan: Plan, model_path: Path, gpu_bytes: Callable[[], int | None]) -> None:
    """`flowrl train`'s gate: on CUDA with train.memory_check, the check on the GPUs `gpu_bytes()` says (asked
    only then); else nothing."""
    if cfg.train.device == "cuda" and cfg.train.memory_check:
        check_memory(cfg, plan, model_path, gpu_bytes())


def check_memory(cfg: RunConfig, plan: Plan, model_path: Path, gpu_bytes: int | None,
                 prompt_len: int = 256) -> None:
    """`flowrl train`'s check of its plan for the model at `model_path` on GPUs of `gpu_bytes` (None: unknown,
    nothing checked; under torchrun LOCAL_WORLD_SIZE GPUs a node): a one-line PlanError that says
    train.memory_check=false tries anyway."""
    if gpu_bytes is None:
        return
    config = json.loads((model_path / "config.json").read_text())
    try:
        shape = ModelShape.from_config(config, DTYPE_BYTES[cfg.model.dtype])
    except KeyError as err:
        warnings.warn(f"no memory estimate: {model_path / 'config.json'} has no {err}", stacklevel=2)
        return
    per_node = int(os.environ["LOCAL_WORLD_SIZE"]) if "LOCAL_WORLD_SIZE" in os.environ else None
    try:
        judge(cfg, plan, shape, prompt_len, gpu_bytes, per_node)
    except PlanError as err:
        raise PlanError(f"{err} (or train.memory_check=false to try anyway)") from None
