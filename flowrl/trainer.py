"""The training loop: compile, build, resume, step, log, checkpoint."""

from __future__ import annotations

import importlib
import json
import random
from pathlib import Path
from typing import Any, Callable

import torch
import transformers
from tqdm import tqdm

from flowrl import checkpoint
from flowrl.algorithm import Algorithm
from flowrl.build import build_roles, model_path, train_engines
from flowrl.config import RunConfig, validate, warn_no_effect
from flowrl.data import PromptStream
from flowrl.executor import LocalExecutor
from flowrl.models.loading import load_tokenizer
from flowrl.planner import MODEL_ROLES, Placement, Plan, compile_plan
from flowrl.roles import ROLE_CLASSES
from flowrl.tasks.arithmetic import TASKS

SHOWN = {"reward/mean": "reward", "actor/pg_loss": "pg_loss", "critic/vf_loss": "vf_loss",
         "response_length/mean": "len", "timing_s/step": "s/step"}


def resolve_algorithm(name: str) -> Algorithm:
    """A registry name ("grpo") or "package.module:attribute"."""
    if ":" in name:
        module, _, attr = name.partition(":")
        algo = getattr(importlib.import_module(module), attr)
    else:
        from flowrl.algorithms import REGISTRY

        if name not in REGISTRY:
            raise ValueError(f"algorithm: unknown {name!r}; built in: {sorted(REGISTRY)} (or 'module:attribute')")
        algo = REGISTRY[name]
    if not isinstance(algo, Algorithm):
        raise ValueError(f"algorithm: {name!r} is a {type(algo).__name__}, not an @flowrl.algorithm")
    return algo


def make_plan(cfg: RunConfig, algo: Algorithm, task: Any) -> Plan:
    """Validate the algorithm's options and compile its graph; loads no model."""
    values = dict(cfg.algo)
    if "max_response_len" in algo.config_cls.model_fields:
        values.setdefault("max_response_len", cfg.rollout.max_new_tokens)
    algo_cfg = validate(algo.config_cls, {**algo.overrides, **values}, prefix="algo")
    inputs = {"prompt_ids", "prompt_mask", "uid", *task.meta_keys}
    placement = cfg.placement
    if placement is None:  # colocate exactly the model roles this configuration uses
        graph, order = algo.trace(inputs, ROLE_CLASSES, algo_cfg)
        used = {graph.nodes[n]["node"].role for n in order}
        placement = Placement.colocated(tuple(r for r in MODEL_ROLES if r in used), device=cfg.train.device)
    return compile_plan(algo, placement, inputs, ROLE_CLASSES, algo_cfg)


def train(cfg: RunConfig, algo: Algorithm | None = None, progress: bool = True,
          on_step: Callable[[int, dict[str, float]], None] | None = None) -> list[dict[str, float]]:
    """Run cfg.train.steps steps (resuming if a checkpoint exists); returns this run's metrics per step."""
    algo = algo or resolve_algorithm(cfg.algorithm)
    task = TASKS[cfg.task.name](max_operand=cfg.task.max_operand)
    plan = make_plan(cfg, algo, task)
    warn_no_effect(cfg, plan.roles)
    _seed(cfg.train.seed)
    transformers.utils.logging.disable_progress_bar()
    out = Path(cfg.train.output_dir)
    path = model_path(cfg, task)
    roles = build_roles(cfg, plan, task, path)
    stream = PromptStream(task, load_tokenizer(path), cfg.train.batch_size, seed=cfg.train.seed)
    start = _resume(cfg, roles, stream)
    executor = LocalExecutor(plan, roles)
    history: list[dict[str, float]] = []
    bar = tqdm(range(start, cfg.train.steps), initial=start, total=cfg.train.steps, disable=not progress,
               desc=algo.name, dynamic_ncols=True)
    for step in bar:
        _, logged = executor.run_step(step, stream)
        logged["step"] = step + 1
        history.append(logged)
        _append_jsonl(out / "metrics.jsonl", logged)
        bar.set_postfix({short: f"{logged[k]:.3g}" for k, short in SHOWN.items() if k in logged})
        if progress:
            bar.write(_format(logged))
        if on_step is not None:
            on_step(step + 1, logged)
        if _due(cfg, step + 1):
            checkpoint.save(out / "checkpoints", step + 1, train_engines(roles),
                            {"stream": stream.state(), "actor_version": _actor_version(roles)},
                            keep=cfg.train.keep_checkpoints)
    return history


def _due(cfg: RunConfig, step: int) -> bool:
    every = cfg.train.save_every
    return step == cfg.train.steps or (every > 0 and step % every == 0)


def _resume(cfg: RunConfig, roles: dict[str, Any], stream: PromptStream) -> int:
    found = checkpoint.latest(Path(cfg.train.output_dir) / "checkpoints") if cfg.train.resume else None
    if found is None:
        return 0
    state = checkpoint.load(found, train_engines(roles))
    stream.restore(state["stream"])
    if "actor" in roles:
        roles["actor"].version = state["actor_version"] + 1  # forces a weight sync into the rollout
    return int(state["step"])


def _actor_version(roles: dict[str, Any]) -> int:
    return roles["actor"].version if "actor" in roles else 0


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def _append_jsonl(path: Path, row: dict[str, float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


LINE = ("reward/mean", "actor/pg_loss", "actor/kl_loss", "actor/clipfrac", "actor/grad_norm", "critic/vf_loss",
        "response_length/mean", "sampling/groups")


def _format(logged: dict[str, float]) -> str:
    body = " ".join(f"{k}={logged[k]:.4g}" for k in LINE if k in logged)
    return f"step {int(logged['step'])}: {body} time={logged.get('timing_s/step', 0):.2f}s"
