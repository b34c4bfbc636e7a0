"""`flowrl plan ALGO --cluster 2x8xH100-80G [--explain] [--write FILE]`: the planner chooses the layout.

Traces the algorithm onto a split placement (so the graph shows which nodes may overlap), reads the model's
shape from its config.json and the step's load from the run config, and asks flowrl.plan.choose for the
fastest layout that fits. The choice is written as a run config file (the user's values with the chosen
placement and engine options) that `flowrl train --config FILE` takes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from flowrl.config import RunConfig
from flowrl.engines.memory import GIB, ModelShape
from flowrl.graph.algorithm import Algorithm
from flowrl.graph.role import role_spec
from flowrl.plan.calibrate import load_refined, predict
from flowrl.plan.candidates import ENGINES, Candidate, Space
from flowrl.plan.choose import Choice, PlannerConfig
from flowrl.plan.cluster import ClusterConfig
from flowrl.plan.costs import CostModel
from flowrl.plan.passes import buffer_depth, token_budget
from flowrl.plan.memory import Roles
from flowrl.plan.placement import Placement, Pool
from flowrl.plan.planner import model_roles
from flowrl.plan.simulate import graph_nodes
from flowrl.config.candidate import batch_sizes, workload
from flowrl.roles.configs import TrainRoleConfig
from flowrl.runtime.layout.memory_check import DTYPE_BYTES
from flowrl.runtime.layout.planning import make_plan, model_config


def choose(cfg: RunConfig, algo: Algorithm, task: Any, cluster: ClusterConfig, prompt_len: int = 256,
           planner: PlannerConfig | None = None, costs: CostModel | None = None) -> tuple[Choice, dict[str, Any]]:
    """The planner's choice on `cluster` and the run config values that carry it out; `costs`: a cost model
    refined by an earlier run (flowrl.plan.calibrate.load_refined), else the device table's."""
    inputs = {"prompt_ids", "prompt_mask", "uid", *task.meta_keys}
    classes = cfg.role_classes(algo.roles)
    roles = model_roles(algo, inputs, classes, None)
    followers = [r for r in roles if role_spec(r, classes.get(r)).weights_from]
    others = [r for r in roles if r not in followers]
    pools = [Pool(name="train", roles=others, device="cuda")] + \
        ([Pool(name="generate", roles=followers, device="cuda")] if followers else [])
    plan = make_plan(cfg.model_copy(update={"placement": Placement(pools=pools)}), algo, task)
    nodes, depth = graph_nodes(plan)
    shape = ModelShape.from_config(model_config(cfg, task), DTYPE_BYTES[cfg.model.dtype])
    work = workload(cfg, plan, prompt_len)  # as `flowrl train`'s memory check reads it (one model)
    trained = [r for r in plan.pools if plan.specs[r].trainable]
    frozen = [r for r in plan.pools if r not in trained and r not in followers]
    lora = getattr(cfg.section(trained[0]).engine, "lora_rank", 0) if trained else 0
    actor = cfg.section(trained[0]).engine if trained else None
    summary = Roles(trained=len(trained), frozen=len(frozen), frozen_lent=bool(lora), rollout=bool(followers),
                    compile=bool(getattr(actor, "compile", False)))
    batch = {k: v for k, v in batch_sizes(cfg, plan).items() if k in ("mini_batch_size", "forward_micro_batch_size")}
    engines = [r for r in trained + frozen if isinstance(cfg.section(r, plan.specs[r]), TrainRoleConfig)]
    space = Space(engines=installed_engines(), lora_ranks=(lora,),
                  gradient_checkpointing=(True,) if cfg.model.gradient_checkpointing else (False, True))
    space = replace(space, **fixed_rollout(cfg, followers))
    costs, planner = costs or CostModel(cluster.kind), planner or PlannerConfig()
    chooser = planner.build()
    choice = chooser.choose(nodes, depth, shape, work, summary, cluster, space, batch, costs)
    values = overrides(choice.best.cand, others, followers, trained, engines, "cuda" if cluster.kind.cuda else "cpu")
    budget = token_budget(choice.best.cand, shape, work, summary, cluster, batch, planner.headroom) \
        if planner.token_budget else 0
    budgeted = chooser.score(replace(choice.best.cand, token_budget=budget), nodes, depth, shape, work, summary,
                             cluster, batch, costs) if budget else None  # its peak and time under the budget
    if budgeted and budgeted.seconds is not None and budgeted.seconds <= choice.best.seconds:
        for role in engines:  # micro-batches grouped by tokens: a row count would have no effect
            values.pop(f"roles.{role}.micro_batch_size")
        values.update({f"roles.{role}.max_tokens_per_micro_batch": budget for role in trained + frozen})
        choice = replace(choice, best=budgeted, scored=[budgeted if s is choice.best else s for s in choice.scored])
    if depth:
        values["plan.buffer_depth"] = buffer_depth(nodes, dict(choice.best.node_s), choice.best.cand, work,
                                                   planner.max_buffer_depth)
    values["plan.predicted"] = predict(choice.best, nodes, depth, costs, cluster.device).model_dump(mode="json")
    return choice, values


def fixed_rollout(cfg: RunConfig, followers: list[str]) -> dict[str, tuple]:
    """What the user set of the rollout's engine, which the planner keeps (Space fields): vLLM where the run names
    it (the cuda preset names hf_static, so that one is the planner's to change), vLLM's tensor_parallel_size and
    enforce_eager."""
    if not followers:
        return {}
    engine, fixed = cfg.section(followers[0]).engine, {}
    given = engine.model_fields_set
    if engine.engine == "vllm":  # by its registered name: vLLM's config class imports vLLM
        fixed["engines"] = ("vllm",)
    for name, field in (("tensor_parallel_size", "tensor_parallel"), ("enforce_eager", "enforce_eager")):
        if name in given:
            fixed[field] = (getattr(engine, name),)
    return fixed


def installed_engines() -> tuple[str, ...]:
    """The rollout engines a plan may pick here: vLLM (an optional package) only where it is installed."""
    return tuple(engine for engine in ENGINES if engine != "vllm" or find_spec("vllm") is not None)


def overrides(cand: Candidate, others: list[str], followers: list[str], trained: list[str],
              engines: list[str], device: str = "cuda") -> dict[str, Any]:
    """Run config values (dotted keys) for the chosen candidate on `device` (cuda, or cpu for the device table's
    CPU row); `engines`: the roles on train engines, whose micro-batches it sizes."""
    pools = [{"name": "global", "roles": others + followers, "world_size": cand.train_gpus, "device": device}] \
        if cand.colocated else [{"name": "train", "roles": others, "world_size": cand.train_gpus, "device": device},
                                {"name": "generate", "roles": followers, "world_size": cand.rollout_gpus,
                                 "device": device}]
    out: dict[str, Any] = {"placement": {"pools": pools}, "train.device": device,
                           "model.gradient_checkpointing": cand.gradient_checkpointing,
                           **{f"roles.{role}.micro_batch_size": cand.micro_batch_size for role in engines}}
    for role in trained:
        out[f"roles.{role}.offload_optimizer"] = cand.offload_optimizer
        out[f"roles.{role}.offload_params"] = cand.offload_params
    for role in followers:
        out[f"roles.{role}.engine"] = cand.engine
        if cand.engine == "vllm":
            out.update({f"roles.{role}.tensor_parallel_size": cand.tensor_parallel,
                        f"roles.{role}.gpu_memory_utilization": cand.gpu_memory_utilization,
                        f"roles.{role}.enforce_eager": cand.enforce_eager,
                        f"roles.{role}.free_cache_engine": cand.sleep_level if cand.colocated else 0})
    return out


def write(values: dict[str, Any], raw: dict[str, Any], path: Path) -> None:
    """The user's raw config values with the chosen ones, nested, as JSON (refuses to overwrite a file)."""
    nested = json.loads(json.dumps(raw))
    for key, value in values.items():
        if key == "plan.buffer_depth":  # advice: the algorithm's own option sets its buffer
            continue
        parts, at = key.split("."), nested
        for part in parts[:-1]:
            at = at.setdefault(part, {})
        at[parts[-1]] = value
    if path.exists():
        raise ValueError(f"--write {path}: the file exists; give a new path")
    path.write_text(json.dumps(nested, indent=2) + "\n")


def print_choice(cfg: RunConfig, algo: Algorithm, task: Any, args: Any) -> str:
    """`flowrl plan --cluster`: the chosen layout (with --explain, the candidates), written with --write."""
    from flowrl.config.loading import read_config_file, set_dotted
    from flowrl.plan.cluster import detect

    cluster = detect(cfg.executor.name == "ray") if args.cluster == "found" else ClusterConfig.parse(args.cluster)
    costs = load_refined(args.costs) if args.costs else None
    choice, values = choose(cfg, algo, task, cluster, args.prompt_len, PlannerConfig(allow_lora=args.allow_lora), costs)
    lines = [choice.explain() if args.explain else f"chosen on {cluster.describe()}: {choice.best.cand.label()}",
             f"predicted {choice.best.seconds:.2f} s/step, peak {max(choice.best.fit.peak.values()) / GIB:.1f} "
             f"GiB per GPU", "run config values: " + ", ".join(f"{k}={v}" for k, v in values.items()
                                                                if k not in ("placement", "plan.predicted"))]
    if args.write:
        raw = read_config_file(args.config) if args.config else {}
        for item in args.set:  # parsed as `flowrl train --set` parses them (JSON where it can be)
            key, _, value = item.partition("=")
            set_dotted(raw, key, value)
        write(values, raw, Path(args.write))
        lines.append(f"wrote {args.write}: flowrl train {algo.name} --config {args.write}")
    return "\n".join(lines)
