"""Build the roles a plan uses from a RunConfig: models, engines, the hybrid engine.

Everything here runs after `compile_plan`, so graph mistakes fail before any
model loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing, checkpoint_wrapper)

from flowrl.config import OptimConfig, RunConfig
from flowrl.engines.hf_rollout import HFRolloutEngine
from flowrl.engines.hf_train import HFTrainEngine
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.weight_sync import choose_weight_sync
from flowrl.models.loading import load_causal_lm, load_tokenizer, load_value_model
from flowrl.models.tiny import build_tiny_model
from flowrl.planner import Plan
from flowrl.roles import Actor, Critic, Ref, Reward, RewardModel, Rollout, UpdateSettings

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def model_path(cfg: RunConfig, task: Any) -> Path:
    """The configured model folder, or the built-in tiny model (built once) for the task's alphabet."""
    if cfg.model.path is not None:
        return _model_folder(cfg.model.path, "model.path")
    return build_tiny_model(Path(cfg.train.output_dir) / "tiny-model", chars=task.chars,
                            hidden_size=cfg.model.tiny_hidden_size, num_layers=cfg.model.tiny_num_layers,
                            seed=cfg.train.seed)


def _model_folder(path: str, field: str) -> Path:
    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"{field}: {path!r} is not a Hugging Face model folder (no config.json)")
    return Path(path)


def _settings(cfg: RunConfig) -> UpdateSettings:
    t = cfg.train
    return UpdateSettings(mini_batch_size=t.mini_batch_size, micro_batch_size=t.micro_batch_size,
                          epochs=t.epochs, temperature=cfg.rollout.temperature)


def _train_engine(model: torch.nn.Module, kind: str, optim: OptimConfig, device: str) -> HFTrainEngine:
    return HFTrainEngine(model, kind=kind, lr=optim.lr, weight_decay=optim.weight_decay, grad_clip=optim.grad_clip,
                         warmup_steps=optim.warmup_steps, device=device)


def build_roles(cfg: RunConfig, plan: Plan, task: Any, path: Path) -> dict[str, Any]:
    """Instantiate each role the plan uses (and the reward); actor and rollout share one module when colocated."""
    return build_subset(cfg, ("reward", *plan.roles), plan.shares_actor_module(), task, path)


def build_subset(cfg: RunConfig, names: tuple[str, ...], shares_actor_module: bool, task: Any,
                 path: Path) -> dict[str, Any]:
    """The roles in `names` (one pool's, or the driver's reward); `task` is needed for "reward" only.

    With `shares_actor_module` (actor and rollout on one pool of one rank) the rollout generates with
    the actor's module; otherwise it loads its own copy.
    """
    dtype, device = DTYPES[cfg.model.dtype], cfg.train.device
    tokenizer = load_tokenizer(path)
    roles: dict[str, Any] = {}
    settings = _settings(cfg)
    if "reward" in names:
        roles["reward"] = _reward(cfg, task, tokenizer, settings, dtype, device)
    if "actor" in names:
        engine = _train_engine(_trainable(load_causal_lm(path, dtype), cfg), "actor", cfg.actor, device)
        roles["actor"] = Actor(engine=engine, settings=settings)
    if "ref" in names:
        ref_engine = _train_engine(load_causal_lm(path, dtype).requires_grad_(False), "actor", cfg.actor, device)
        roles["ref"] = Ref(engine=ref_engine, settings=settings)
    if "critic" in names:
        critic = _trainable(load_value_model(path, dtype), cfg)
        roles["critic"] = Critic(engine=_train_engine(critic, "critic", cfg.critic, device), settings=settings)
    if "rollout" in names:
        roles["rollout"] = _rollout(cfg, shares_actor_module, roles.get("actor"), tokenizer, path, dtype, device)
    return roles


def _reward(cfg: RunConfig, task: Any, tokenizer: Any, settings: UpdateSettings, dtype: torch.dtype,
            device: str) -> Reward | RewardModel:
    """The task's reward function, or the reward model at model.reward_path."""
    if cfg.model.reward_path is None:
        return Reward(fn=task.reward, tokenizer=tokenizer, meta_keys=task.meta_keys)
    model = load_value_model(_model_folder(cfg.model.reward_path, "model.reward_path"), dtype)
    if model.config.vocab_size != len(tokenizer):
        raise ValueError(f"model.reward_path: the reward model's vocab_size {model.config.vocab_size} differs from "
                         f"the policy tokenizer's {len(tokenizer)}; it must share the policy's tokenizer")
    engine = HFTrainEngine(model.requires_grad_(False), kind="reward", device=device)
    return RewardModel(engine=engine, settings=settings)


def _trainable(model: torch.nn.Module, cfg: RunConfig) -> torch.nn.Module:
    """With model.gradient_checkpointing, each decoder layer recomputes its activations in backward.

    torch's checkpoint wrapper (what FSDP2 setups use) rather than transformers' switch, whose name
    differs across transformers 5 releases; state-dict keys stay unchanged.
    """
    if cfg.model.gradient_checkpointing:
        layers = set(model.model.layers)
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                       check_fn=lambda module: module in layers)
    return model


def _rollout(cfg: RunConfig, shares_actor_module: bool, actor: Actor | None, tokenizer: Any, path: Path,
             dtype: torch.dtype, device: str) -> Rollout:
    shared = actor is not None and shares_actor_module
    module = actor.engine.model if shared else load_causal_lm(path, dtype)
    engine = HFRolloutEngine(module, tokenizer, device=device)
    r = cfg.rollout
    params = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)
    sync = choose_weight_sync(actor.engine.model, module) if actor is not None else None
    return Rollout(engine=engine, params=params, actor=actor, weight_sync=sync, seed=cfg.train.seed)

