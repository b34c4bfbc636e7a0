"""`flowrl plan ALGO --gpus N [--nodes M] [--split R]`: pools built for a GPU count, with a memory estimate.

Loads no weights: the model's shape comes from its config.json (the built-in tiny model's recipe when
model.path is unset), the workload from the run config, and the planner's phase model judges the layout
(flowrl.runtime.layout.memory_check, as `flowrl train` on CUDA checks its own plan against the memory of its GPUs).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import transformers

from flowrl.config import RunConfig, validate
from flowrl.engines.configs import RolloutEngineConfig
from flowrl.engines.memory import GIB, ModelShape
from flowrl.engines.weights.reshard_plan import check_layout
from flowrl.engines.models.tiny_model import build_tiny_model
from flowrl.errors import MissingField, PlanError
from flowrl.graph.algorithm import Algorithm
from flowrl.graph.role import role_spec
from flowrl.plan.placement import Placement
from flowrl.plan.planner import Plan, compile_plan, model_roles
from flowrl.plan.resources import gpu_placement
from flowrl.roles.configs import EngineRoleConfig
from flowrl.config.candidate import workload
from flowrl.runtime.layout.memory_check import DTYPE_BYTES, judge


def plan_on_gpus(cfg: RunConfig, algo: Algorithm, task: Any, gpus: int, nodes: int = 1, split: float | None = None,
                 gpu_gib: float = 80.0, prompt_len: int = 256, gpus_per_node: int | None = None,
                 fmt: str = "text") -> str:
    """The plan on `gpus` GPUs (pools, memory per GPU, graph) as `fmt` (`flowrl plan --format`: text, json,
    mermaid or dot; the last two: the header and estimate as comments before the graph's source); a PlanError
    when an estimate does not fit."""
    inputs = {"prompt_ids", "prompt_mask", "uid", *task.meta_keys}
    classes = cfg.role_classes(algo.roles)
    roles = model_roles(algo, inputs, classes, None)
    followers = tuple(r for r in roles if role_spec(r, classes.get(r)).weights_from)
    if gpus_per_node is not None and gpus > 0 and nodes > 0 and gpus % nodes == 0 and gpus // nodes > gpus_per_node:
        raise PlanError(f"placement: --gpus {gpus} on --nodes {nodes} is {gpus // nodes} GPUs a node, but a node "
                        f"has {gpus_per_node} (--gpus-per-node); use --nodes {-(-gpus // gpus_per_node)}")
    placement = gpu_placement(roles, followers, gpus, nodes, split)
    cfg = cfg.model_copy(update={"placement": placement, "train": cfg.train.model_copy(update={"device": "cuda"})})
    plan = make_plan(cfg, algo, task)
    shape = ModelShape.from_config(model_config(cfg, task), DTYPE_BYTES[cfg.model.dtype])
    work = workload(cfg, plan, prompt_len)
    judged = judge(cfg, plan, shape, prompt_len, int(gpu_gib * GIB), gpus // nodes)
    pools = {pool.name: pool for pool in plan.pools.values()}
    if fmt == "json":
        return json.dumps({"gpus": gpus, "nodes": nodes, "gpu_gib": gpu_gib, "num_params": shape.num_params,
                           "rows": work.rows, "seq_len": work.seq_len, "peak_bytes_per_gpu": judged.peak,
                           "pools": {name: {"world_size": pool.world_size, "device": pool.device,
                                            "bytes_per_gpu": judged.per_gpu.get(name, {})}
                                     for name, pool in pools.items()},
                           "plan": plan.describe().splitlines()}, indent=2)
    header = (f"{gpus} GPUs on {nodes} node(s), {gpu_gib:g} GiB each; model {shape.num_params / 1e6:.1f}M "
              f"parameters; {work.rows} rows of {work.seq_len} tokens per step")
    if fmt in ("mermaid", "dot"):
        comment = "%% " if fmt == "mermaid" else "// "
        notes = "\n".join(comment + line for line in [header, *judged.table.splitlines()])
        return f"{notes}\n{plan.mermaid() if fmt == 'mermaid' else plan.dot()}"
    return "\n".join([header, judged.table, plan.describe()])


def make_plan(cfg: RunConfig, algo: Algorithm, task: Any, world_size: int = 1, gpus: int | None = None) -> Plan:
    """Validate the algorithm's options and compile its graph; loads no model. Placement 'auto' colocates the
    model roles on `world_size` ranks, or on `gpus` CUDA ranks (a Ray cluster's) split by executor.rollout_share.
    A field no node writes says where else it may come from: the data."""
    try:
        return _make_plan(cfg, algo, task, world_size, gpus)
    except MissingField as err:
        raise MissingField(f"{err}; if the data should give it, set data.train_files to a data set whose rows "
                           f"give {err.field!r} (flowrl.data.dataset: prompts, SFT messages, preference pairs)",
                           err.field) from None


def _make_plan(cfg: RunConfig, algo: Algorithm, task: Any, world_size: int, gpus: int | None) -> Plan:
    values = dict(cfg.algo)
    if "max_response_len" in algo.config_cls.model_fields:
        values.setdefault("max_response_len", cfg.rollout.max_new_tokens)
    algo_cfg = validate(algo.config_cls, {**algo.overrides, **values}, prefix="algo", strict=True)
    inputs = {"prompt_ids", "prompt_mask", "uid", *task.meta_keys}
    classes = cfg.role_classes(algo.roles)
    placement = cfg.placement
    if placement == "auto":  # exactly the model roles this configuration uses
        roles = model_roles(algo, inputs, classes, algo_cfg)
        if gpus is None:
            placement = Placement.colocated(roles, world_size=world_size, device=cfg.train.device)
        else:
            followers = tuple(r for r in roles if role_spec(r, classes.get(r)).weights_from)
            placement = gpu_placement(roles, followers, gpus, split=cfg.executor.rollout_share)
    placement = tensor_parallel_ranks(cfg, placement, classes, ray=cfg.executor.name == "ray")
    return compile_plan(algo, placement, inputs, classes, algo_cfg)


def tensor_parallel_ranks(cfg: RunConfig, placement: Placement, classes: dict[str, type], ray: bool) -> Placement:
    """Each pool hosting a rollout engine of tensor_parallel_size k > 1 (RolloutEngineConfig.tensor_ranks): on
    Ray and CUDA, a pool of N GPUs whose engine runs a replica as one process spanning its k GPUs
    (RANK_SPANS_GPUS: vllm_server) becomes N / k ranks of k GPUs each (`Pool.gpus_per_rank`: the bundle Ray
    gives each; elsewhere one rank drives such a server, its workers vLLM's own); an in-process engine's
    replicas span k ranks of a CPU pool (on CUDA the memory check refuses a bad layout in its own line,
    flowrl.runtime.layout.memory_check). A k that does not divide the pool is one PlanError line."""
    pools = []
    for pool in placement.pools:
        engines = [section.engine for role in pool.roles
                   if isinstance(section := cfg.section(role, role_spec(role, classes.get(role))), EngineRoleConfig)
                   and isinstance(section.engine, RolloutEngineConfig)]
        k = max((engine.tensor_ranks() for engine in engines), default=1)
        spans = any(engine.RANK_SPANS_GPUS for engine in engines)
        mine = ray and pool.device == "cuda" if spans else pool.device != "cuda"
        if k == 1 or pool.gpus_per_rank != 1 or not mine:
            pools.append(pool)
            continue
        try:
            ranks = check_layout(pool.world_size, k)
        except ValueError as err:
            raise PlanError(f"placement: pool {pool.name!r}: {err}") from None
        pools.append(pool.model_copy(update={"world_size": ranks, "gpus_per_rank": k}) if spans else pool)
    return placement.model_copy(update={"pools": pools})


def model_config(cfg: RunConfig, task: Any) -> dict:
    if cfg.model.path is not None:
        return json.loads((Path(cfg.model.path) / "config.json").read_text())
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as folder:  # the built-in model's recipe, built tiny and thrown away
        path = build_tiny_model(Path(folder) / "m", chars=task.chars, hidden_size=cfg.model.tiny_hidden_size,
                                num_layers=cfg.model.tiny_num_layers)
        return json.loads((path / "config.json").read_text())
