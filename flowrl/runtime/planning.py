"""`flowrl plan ALGO --gpus N [--nodes M] [--split R]`: pools built for a GPU count, with a memory estimate.

Loads no weights: the model's shape comes from its config.json (the built-in tiny model's recipe when
model.path is unset), the workload from the run config, and flowrl.plan.resources does the arithmetic.
`flowrl train` on CUDA checks its plan the same way against the memory of its GPUs (`check_memory`).
"""

from __future__ import annotations

import itertools
import json
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import transformers

from flowrl.config import RunConfig, validate
from flowrl.engines.configs import EngineConfig
from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.engines.models.tiny_model import build_tiny_model
from flowrl.errors import MissingField, PlanError
from flowrl.graph.algorithm import Algorithm
from flowrl.graph.role import role_spec
from flowrl.plan.placement import Placement
from flowrl.plan.planner import Plan, compile_plan, model_roles
from flowrl.plan.resources import GIB, ModelShape, Workload, check_fits, describe, estimate, gpu_placement
from flowrl.roles.configs import EngineRoleConfig, TrainRoleConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


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
    shape, work, per_gpu = _estimate(cfg, plan, model_config(cfg, task), prompt_len)
    check_with_fixes(cfg, plan, shape, work, per_gpu, int(gpu_gib * GIB))
    pools = {pool.name: pool for pool in plan.pools.values()}
    if fmt == "json":
        return json.dumps({"gpus": gpus, "nodes": nodes, "gpu_gib": gpu_gib, "num_params": shape.num_params,
                           "rows": work.rows, "seq_len": work.seq_len,
                           "pools": {name: {"world_size": pool.world_size, "device": pool.device,
                                            "bytes_per_gpu": per_gpu.get(name, {})} for name, pool in pools.items()},
                           "plan": plan.describe().splitlines()}, indent=2)
    header = (f"{gpus} GPUs on {nodes} node(s), {gpu_gib:g} GiB each; model {shape.num_params / 1e6:.1f}M "
              f"parameters; {work.rows} rows of {work.seq_len} tokens per step")
    if fmt in ("mermaid", "dot"):
        comment = "%% " if fmt == "mermaid" else "// "
        notes = "\n".join(comment + line for line in [header, *describe(per_gpu, pools).splitlines()])
        return f"{notes}\n{plan.mermaid() if fmt == 'mermaid' else plan.dot()}"
    return "\n".join([header, describe(per_gpu, pools), plan.describe()])


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
    return compile_plan(algo, placement, inputs, classes, algo_cfg)


def check_memory(cfg: RunConfig, plan: Plan, model_path: Path, gpu_bytes: int | None,
                 prompt_len: int = 256) -> None:
    """A PlanError naming the pool when the estimate for the model at `model_path` exceeds `gpu_bytes` per GPU
    (None: unknown, nothing checked); prompts are assumed data.max_prompt_length (else `prompt_len`) long."""
    if gpu_bytes is None:
        return
    config = json.loads((model_path / "config.json").read_text())
    try:
        shape, work, per_gpu = _estimate(cfg, plan, config, cfg.data.max_prompt_length or prompt_len)
    except KeyError as err:
        warnings.warn(f"no memory estimate: {model_path / 'config.json'} has no {err}", stacklevel=2)
        return
    try:
        check_with_fixes(cfg, plan, shape, work, per_gpu, gpu_bytes)
    except PlanError as err:
        raise PlanError(f"{err} (or train.memory_check=false to try anyway)") from None


def check_with_fixes(cfg: RunConfig, plan: Plan, shape: ModelShape, work: Workload, per_gpu: dict,
                     gpu_bytes: int) -> None:
    """check_fits, whose refusal also names every smallest set of flowrl's own memory options with which the
    estimate fits these GPUs: activation checkpointing, the optimizer offloaded, LoRA on the policy (it changes
    the math: offered, never applied), a token budget of one sequence per micro-batch."""
    try:
        check_fits(plan, per_gpu, gpu_bytes)
    except PlanError as err:
        found = fixes(cfg, plan, shape, work, gpu_bytes)
        hint = "; or ".join(" + ".join(f) for f in found) if found else "none of flowrl's memory options alone"
        raise PlanError(f"{err}; it would fit with {hint} (`flowrl plan ALGO --cluster found --explain` chooses "
                        f"among them)") from None


def fixes(cfg: RunConfig, plan: Plan, shape: ModelShape, work: Workload, gpu_bytes: int) -> list[list[str]]:
    """The smallest sets of `--set` values with which every pool's estimate fits `gpu_bytes` a GPU."""
    engines = _engines(cfg, plan)
    tuned = [r for r, e in engines.items() if isinstance(e, HFTrainConfig)]
    trained = [r for r in tuned if plan.specs[r].trainable]
    policies = [r for r in trained if any(s.weights_from == r for s in plan.specs.values())]
    budget = 1 << (work.seq_len - 1).bit_length()  # the smallest power of two that holds one sequence
    options = {"model.gradient_checkpointing=true": ((), {}),
               **{f"roles.{r}.offload_optimizer=true": ((r,), {"offload_optimizer": True}) for r in trained},
               **{f"roles.{r}.lora_rank=64": ((r,), {"lora_rank": 64}) for r in policies},
               "token budget": (tuple(tuned), {"max_tokens_per_micro_batch": budget})}
    names = {"token budget": " + ".join(f"roles.{r}.max_tokens_per_micro_batch={budget}" for r in tuned)}
    found: list[frozenset[str]] = []
    for size in range(1, len(options) + 1):
        for combo in itertools.combinations(options, size):
            if any(f <= set(combo) for f in found):
                continue
            changed, each = dict(engines), replace(work, gradient_checkpointing=work.gradient_checkpointing or
                                                   "model.gradient_checkpointing=true" in combo)
            for key in combo:
                roles, update = options[key]
                changed.update({r: changed[r].model_copy(update=update) for r in roles})
            per_gpu = estimate(plan, shape, each, changed)
            if all(sum(sum(p.values()) for p in roles.values()) <= gpu_bytes for roles in per_gpu.values()):
                found.append(frozenset(combo))
    return [[names.get(k, k) for k in options if k in f] for f in found]


def _estimate(cfg: RunConfig, plan: Plan, config: dict, prompt_len: int) -> tuple[ModelShape, Workload, dict]:
    shape = ModelShape.from_config(config, DTYPE_BYTES[cfg.model.dtype])
    n = max([node.row_multiplier() for node in plan.nodes] or [1])
    sections = [cfg.section(role, plan.specs[role]) for role in plan.pools]
    micro = max([s.micro_batch_size for s in sections if isinstance(s, TrainRoleConfig)]  # the largest pass's
                or [TrainRoleConfig.model_fields["micro_batch_size"].default])
    work = Workload(rows=cfg.train.batch_size * n, micro_batch_size=micro,
                    seq_len=prompt_len + cfg.rollout.max_new_tokens,
                    gradient_checkpointing=cfg.model.gradient_checkpointing)
    return shape, work, estimate(plan, shape, work, _engines(cfg, plan))


def _engines(cfg: RunConfig, plan: Plan) -> dict[str, EngineConfig]:
    """Each placed role's engine config, which estimates its memory: the one its section holds (roles.<name>)."""
    sections = {role: cfg.section(role, plan.specs[role]) for role in plan.pools}
    return {role: section.engine for role, section in sections.items() if isinstance(section, EngineRoleConfig)}


def model_config(cfg: RunConfig, task: Any) -> dict:
    if cfg.model.path is not None:
        return json.loads((Path(cfg.model.path) / "config.json").read_text())
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as folder:  # the built-in model's recipe, built tiny and thrown away
        path = build_tiny_model(Path(folder) / "m", chars=task.chars, hidden_size=cfg.model.tiny_hidden_size,
                                num_layers=cfg.model.tiny_num_layers)
        return json.loads((path / "config.json").read_text())
